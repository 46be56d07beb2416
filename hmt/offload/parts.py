"""Run a variant's chain in two parts around a cut (no torch): the device's and the peer's.

:class:`SplitChain` loads a variant's segments and exit heads once and runs any range of
it: :meth:`SplitChain.run_head` (the device's part: may answer from an early exit before
anything is sent) and :meth:`SplitChain.run_tail` (the peer's part, and the device's own
fallback when the peer does not answer in time: the same graphs, so the same answer).
Each graph is timed at warm-up; those times are what the planner predicts with.

Segments and exits load through the runtime layer (:mod:`hmt.runtime.variant`) with the
engine it resolves for the variant (``auto``: fuse's per-graph choice, TVM where the
bundle has its libraries and fuse chose it) and fuse's ONNX Runtime options, verified
against the manifest. A TVM library built for another machine than this one (a peer
bundle copied from a device of another architecture) is not loaded: ONNX Runtime runs
that variant, and :attr:`SplitChain.notes` says so. The inner cuts' head and tail graphs
are ONNX only (partitioning exports ONNX; nothing compiles them for TVM), so they run on
ONNX Runtime with the same options. :meth:`SplitChain.runner` hands serve's pool the same
sessions, so a device that serves and offloads holds each graph once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from hmt.bundle import Bundle, BundleVariant
from hmt.errors import ModelError
from hmt.offload.plan import Cut, graphs_sha256, has_file
from hmt.runtime.chain import ChainRunner
from hmt.runtime.chain import answer as answer_of
from hmt.runtime.ort import ort_session
from hmt.runtime.variant import SERVE_DEFAULT_ORT, VariantRuntime, graph_fn, resolve_engine
from hmt.runtime.verified import read_verified

GraphFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Answer:
    class_index: int
    confidence: float
    exit: int
    compute_ms: float
    probabilities: np.ndarray | None = None  # softmax at the answering exit (float32); None: not sent


def _libraries_run_here(bundle: Bundle, variant: BundleVariant) -> str | None:
    """None when the variant's TVM libraries are built for this machine, else why not."""
    from hmt.deploy.elf import read_elf_header
    from hmt.deploy.targets import host_arch

    here = host_arch()
    for graph in variant.graphs():
        if graph.tvm is not None:
            machine = read_elf_header(bundle.path(graph.tvm)).machine
            if machine != here:
                return f"its TVM libraries are built for {machine}, this machine is {here}"
    return None


def chain_engine(bundle: Bundle, variant: BundleVariant, requested: str = "auto") -> tuple[str, list[str]]:
    """The engine the runtime layer resolves for ``variant`` here, and a note when it fell back."""
    engine = resolve_engine(requested, variant)
    if engine == "tvm":
        why = _libraries_run_here(bundle, variant)
        if why is not None:
            if requested == "tvm":
                raise ModelError(f"variant {variant.arch_id!r}: --engine tvm, but {why}")
            return "onnxruntime", [f"onnxruntime, not fuse's tvm: {why}"]
    return engine, []


class SplitChain:
    """One variant, runnable from any cut to any side (see the module docstring)."""

    def __init__(self, bundle: Bundle, variant: BundleVariant, cuts: tuple[Cut, ...], threads: int | None = 1,
                 engine: str = "auto") -> None:
        self.variant = variant
        self.arch_id = variant.arch_id
        self.cuts = cuts
        self.graphs_sha256 = graphs_sha256(bundle, variant, cuts)  # the peer's and the device's must match
        n = variant.exit_stage + 1
        self.engine, self.notes = chain_engine(bundle, variant, engine)
        runtime = VariantRuntime.of(variant)
        ort = runtime.ort if self.engine == runtime.engine or runtime.engine is None else None
        self._segments = [graph_fn(bundle, g, self.engine, threads, ort=ort, notes=self.notes)
                          for g in variant.segments[:n]]
        self._exits = [graph_fn(bundle, g, self.engine, threads, ort=ort, notes=self.notes)
                       for g in variant.exits[:n]]
        options = runtime.ort or SERVE_DEFAULT_ORT
        if threads is not None:
            options = replace(options, intra_op_threads=threads)

        def onnx_only(path: str) -> GraphFn:
            session = ort_session(read_verified(bundle.artifact, path), options, what=str(bundle.root / path))
            return session.graph_fn()

        self._heads: dict[int, GraphFn] = {}
        self._tails: dict[int, GraphFn] = {}
        for cut in cuts:
            if cut.head is not None and has_file(bundle, cut.head):  # a peer bundle has no heads
                self._heads[cut.index] = onnx_only(cut.head)
            if cut.tail is not None:
                self._tails[cut.index] = onnx_only(cut.tail)
        self.segment_ms = [1.0] * n
        self.exit_ms = [1.0] * n
        self.head_ms: dict[int, float] = {}
        self.tail_ms: dict[int, float] = {}

    @property
    def last(self) -> int:
        return self.variant.exit_stage

    def runner(self) -> ChainRunner:
        """serve's runner of the whole variant over these very sessions (not a second copy)."""
        return ChainRunner(self.variant, self._segments, self._exits, self.engine,
                           [*self.notes, "sessions shared with the offload device"])

    def cut(self, index: int) -> Cut:
        if not 0 <= index < len(self.cuts):
            raise ModelError(f"variant {self.arch_id!r} has no cut {index} (it has {len(self.cuts)})")
        return self.cuts[index]

    def _exit(self, k: int, features: np.ndarray, confidence: float | None, start: float) -> Answer | None:
        if k < self.last and confidence is None:
            return None
        class_index, conf, probabilities = answer_of(self._exits[k](features))
        if k == self.last or conf >= confidence:  # type: ignore[operator]
            return Answer(class_index, conf, k, (time.perf_counter() - start) * 1e3, probabilities)
        return None

    def _segments_from(self, first: int, features: np.ndarray, confidence: float | None,
                       start: float) -> Answer:
        for k in range(first, self.last + 1):
            features = self._segments[k](features)
            answer = self._exit(k, features, confidence, start)
            if answer is not None:
                return answer
        raise AssertionError("unreachable: the last exit always answers")

    def run_local(self, x: np.ndarray, confidence: float | None) -> Answer:
        """The whole chain on this machine."""
        return self._segments_from(0, x, confidence, time.perf_counter())

    def run_head(self, x: np.ndarray, cut: Cut, confidence: float | None) -> Answer | np.ndarray:
        """The device's part: an answer from an early exit, or the tensor to send."""
        start = time.perf_counter()
        features = x
        for k in range(cut.device_segments):
            features = self._segments[k](features)
            answer = self._exit(k, features, confidence, start) if k < self.last else None
            if answer is not None:
                return answer
        if cut.kind == "inner":
            head = self._heads.get(cut.index)
            if head is None:
                raise ModelError(f"variant {self.arch_id!r}: this bundle has no head graph for cut {cut.index}")
            features = head(features)
        return features

    def run_tail(self, t: np.ndarray, cut: Cut, confidence: float | None) -> Answer:
        """The peer's part (or the device's fallback): from the cut's tensor to an answer."""
        start = time.perf_counter()
        if cut.kind != "inner":
            return self._segments_from(cut.device_segments, t, confidence, start)
        features = self._tails[cut.index](t)
        k = cut.device_segments
        answer = self._exit(k, features, confidence, start)
        return answer if answer is not None else self._segments_from(k + 1, features, confidence, start)

    def warm_up(self, x: np.ndarray, runs: int = 3) -> None:
        """Median time of every graph (segments, exits, inner heads and tails) on ``x``'s path."""
        def timed(fn: GraphFn, arg: np.ndarray) -> tuple[np.ndarray, float]:
            times, out = [], arg
            for _ in range(max(1, runs)):
                t0 = time.perf_counter()
                out = fn(arg)
                times.append((time.perf_counter() - t0) * 1e3)
            return out, max(1e-4, float(np.median(times)))

        inputs = [x]
        for k in range(self.last + 1):
            out, self.segment_ms[k] = timed(self._segments[k], inputs[-1])
            _, self.exit_ms[k] = timed(self._exits[k], out)
            inputs.append(out)
        for cut in self.cuts:
            if cut.kind != "inner":
                continue
            if cut.index in self._heads:
                middle, self.head_ms[cut.index] = timed(self._heads[cut.index], inputs[cut.device_segments])
            else:  # the peer: time the tail on a tensor of the cut's shape
                middle = np.full(cut.tensor.shape, 0.5, dtype=np.float32)
            _, self.tail_ms[cut.index] = timed(self._tails[cut.index], middle)

    def device_ms(self, cut: Cut | None) -> float:
        """Warm time of the device's part of ``cut`` (None: the whole chain), no early exit."""
        if cut is None:
            return sum(self.segment_ms) + self.exit_ms[-1]
        head = sum(self.segment_ms[: cut.device_segments])
        return head + (self.head_ms.get(cut.index, 0.5 * self.segment_ms[cut.device_segments])
                       if cut.kind == "inner" else 0.0)

    def tail_time_ms(self, cut: Cut) -> float:
        """Warm time of the peer's part of ``cut`` on this machine, no early exit."""
        rest = sum(self.segment_ms[cut.device_segments:]) + self.exit_ms[-1]
        if cut.kind == "inner":
            rest -= self.segment_ms[cut.device_segments]
            rest += self.tail_ms.get(cut.index, 0.5 * self.segment_ms[cut.device_segments])
        return rest
