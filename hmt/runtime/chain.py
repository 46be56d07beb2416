"""A variant's chain of graphs, run with early exit by confidence; and the merged single graph.

A variant is ``segment_0 .. segment_s`` plus one exit head per segment (``hmt.bundle``).
:class:`ChainRunner` feeds the input through the segments in order; after segment ``k``
it runs ``exit_k`` and stops when the head's softmax confidence reaches the threshold,
else it goes on, up to the variant's ``exit_stage`` whose answer is always taken. With
early exit off only the last head runs.

:class:`MergedChainRunner` runs fuse's merged chain (every segment and the last head as
one ONNX graph, :func:`hmt.fuse.engines.ort.merge_chain`): one session call per
inference, no early exit. fuse measured it 1.25-1.33x faster than ORT's default on small
variants, where each graph boundary costs as much as the compute.

Both share one interface (:class:`Runner`), so serve's pool and loop treat them alike.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from hmt.compat import strict_zip
from hmt.errors import ModelError

GraphFn = Callable[[np.ndarray], np.ndarray]
LAYOUT_CHAIN = "per_graph"
LAYOUT_MERGED = "merged_chain"


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax probabilities (float64) of one row of logits (numerically stable)."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if row.size == 0 or not np.all(np.isfinite(row)):
        raise ModelError("an exit head produced empty or non-finite logits")
    weights = np.exp(row - row.max())
    return weights / weights.sum()


def softmax_confidence(logits: np.ndarray) -> tuple[int, float]:
    """Arg-max class and its softmax probability of one row of logits (numerically stable)."""
    probabilities = softmax(logits)
    best = int(np.argmax(probabilities))
    return best, float(probabilities[best])


def answer(logits: np.ndarray) -> tuple[int, float, np.ndarray]:
    """Arg-max class, its probability and every class's probability (float32) of one row of logits."""
    probabilities = softmax(logits)
    best = int(np.argmax(probabilities))
    return best, float(probabilities[best]), probabilities.astype(np.float32)


@dataclass(frozen=True)
class ChainResult:
    class_index: int
    confidence: float
    exit: int  # segment whose head answered
    compute_ms: float
    predicted_share: float  # share of the longest path's warm time this run spent (for r)
    probabilities: np.ndarray | None = None  # softmax over the classes at the answering exit (float32)


class Runner(Protocol):
    """What serve needs of a loaded variant."""

    arch_id: str
    engine: str
    layout: str
    exit_stage: int
    warm: bool
    variant: Any
    notes: list[str]

    @property
    def memory_bytes(self) -> int: ...

    def run(self, x: np.ndarray, confidence: float | None) -> ChainResult: ...

    def warm_up(self, x: np.ndarray, runs: int = 3) -> None: ...

    def full_ms(self, early_exit: bool = False) -> float: ...

    def close(self) -> None: ...


class ChainRunner:
    """A loaded variant run graph by graph: ``run(x)`` answers one input; ``warm_up()`` times every graph."""

    layout = LAYOUT_CHAIN

    def __init__(self, variant: Any, segments: Sequence[GraphFn], exits: Sequence[GraphFn], engine: str,
                 notes: Sequence[str] = ()) -> None:
        self.variant = variant
        self.arch_id: str = variant.arch_id
        self.exit_stage: int = variant.exit_stage
        self.engine = engine
        self.notes = list(notes)
        self._segments = list(segments[: variant.exit_stage + 1])
        self._exits = list(exits[: variant.exit_stage + 1])
        n = variant.exit_stage + 1
        # Warm-up timings per graph (ms); until measured every graph counts the same.
        self.segment_ms = [1.0] * n
        self.exit_ms = [1.0] * n
        self.warm = False

    @property
    def memory_bytes(self) -> int:
        return int(self.variant.memory_mb * 1e6)

    def full_ms(self, early_exit: bool = False) -> float:
        """Warm time of the longest path: every segment and the last head, plus, with early
        exit on, every intermediate head (a request that exits nowhere early pays for them)."""
        return sum(self.segment_ms) + (sum(self.exit_ms) if early_exit else self.exit_ms[-1])

    def run(self, x: np.ndarray, confidence: float | None) -> ChainResult:
        """Answer ``x``; ``confidence=None`` turns early exit off (only the last head runs)."""
        start = time.perf_counter()
        last = self.exit_stage
        features = x
        spent_ms = 0.0
        for k in range(last + 1):
            features = self._segments[k](features)
            spent_ms += self.segment_ms[k]
            if k < last and confidence is None:
                continue
            class_index, conf, probabilities = answer(self._exits[k](features))
            spent_ms += self.exit_ms[k]
            if k == last or (confidence is not None and conf >= confidence):
                elapsed_ms = (time.perf_counter() - start) * 1e3
                return ChainResult(class_index, conf, k, elapsed_ms, spent_ms / self.full_ms(confidence is not None),
                                   probabilities)
        raise AssertionError("unreachable: the last exit always answers")

    def run_batch(self, xs: np.ndarray, confidence: float | None) -> list[ChainResult]:
        """Answer a batch (rows of ``xs`` along the first axis) in one call per graph: rows whose exit is
        confident leave, the rest go on. Needs graphs that take a batch (serve's dynamic batching
        checks that first); each answer's compute time is the whole batch's."""
        start = time.perf_counter()
        last = self.exit_stage
        rows = np.arange(len(xs))
        features = xs
        answers: dict[int, tuple[int, float, int, float, np.ndarray]] = {}
        spent_ms = 0.0
        for k in range(last + 1):
            features = self._segments[k](features)
            spent_ms += self.segment_ms[k]
            if k < last and confidence is None:
                continue
            logits = self._exits[k](features)
            spent_ms += self.exit_ms[k]
            keep = []
            for i, row in enumerate(rows):
                class_index, conf, probabilities = answer(logits[i])
                if k == last or (confidence is not None and conf >= confidence):
                    answers[int(row)] = (class_index, conf, k, spent_ms, probabilities)
                else:
                    keep.append(i)
            if not keep:
                break
            rows, features = rows[keep], features[keep]
        elapsed_ms = (time.perf_counter() - start) * 1e3
        full = self.full_ms(confidence is not None)
        return [ChainResult(c, conf, k, elapsed_ms, spent / full, p) for c, conf, k, spent, p in
                (answers[i] for i in range(len(xs)))]

    def warm_up(self, x: np.ndarray, runs: int = 3) -> None:
        """Run every graph ``runs`` times and keep the median time of each (the shares for ``r``)."""
        runs = max(1, runs)
        features = x
        for k in range(self.exit_stage + 1):
            seg_times, exit_times = [], []
            out = features
            for _ in range(runs):
                t0 = time.perf_counter()
                out = self._segments[k](features)
                t1 = time.perf_counter()
                self._exits[k](out)
                t2 = time.perf_counter()
                seg_times.append((t1 - t0) * 1e3)
                exit_times.append((t2 - t1) * 1e3)
            self.segment_ms[k] = max(1e-4, float(np.median(seg_times)))
            self.exit_ms[k] = max(1e-4, float(np.median(exit_times)))
            features = out
        self.warm = True

    def close(self) -> None:
        """Drop the sessions now (a request still holding this runner keeps working until it returns)."""
        self._segments = []
        self._exits = []
        self.warm = False


class MergedChainRunner:
    """fuse's merged chain: the whole path to ``exit_stage`` as one graph, one call per input."""

    layout = LAYOUT_MERGED

    def __init__(self, variant: Any, graph: GraphFn, engine: str = "onnxruntime", notes: Sequence[str] = ()) -> None:
        self.variant = variant
        self.arch_id: str = variant.arch_id
        self.exit_stage: int = variant.exit_stage
        self.engine = engine
        self.notes = list(notes)
        self._graph: GraphFn | None = graph
        self.total_ms = 1.0
        self.warm = False

    @property
    def memory_bytes(self) -> int:
        return int(self.variant.memory_mb * 1e6)

    def full_ms(self, early_exit: bool = False) -> float:
        return self.total_ms

    def run(self, x: np.ndarray, confidence: float | None) -> ChainResult:
        """Answer ``x`` at ``exit_stage`` (the merged graph has no early exits: ``confidence`` is ignored)."""
        graph = self._graph
        if graph is None:
            raise ModelError(f"variant {self.arch_id!r} was unloaded")
        start = time.perf_counter()
        class_index, conf, probabilities = answer(graph(x))
        elapsed_ms = (time.perf_counter() - start) * 1e3
        return ChainResult(class_index, conf, self.exit_stage, elapsed_ms, 1.0, probabilities)

    def run_batch(self, xs: np.ndarray, confidence: float | None) -> list[ChainResult]:
        """Answer a batch in one call (needs a graph that takes one; see :meth:`ChainRunner.run_batch`)."""
        graph = self._graph
        if graph is None:
            raise ModelError(f"variant {self.arch_id!r} was unloaded")
        start = time.perf_counter()
        logits = graph(xs)
        elapsed_ms = (time.perf_counter() - start) * 1e3
        results = []
        for row in logits:
            class_index, conf, probabilities = answer(row)
            results.append(ChainResult(class_index, conf, self.exit_stage, elapsed_ms, 1.0, probabilities))
        return results

    def warm_up(self, x: np.ndarray, runs: int = 3) -> None:
        graph = self._graph
        if graph is None:
            raise ModelError(f"variant {self.arch_id!r} was unloaded")
        times = []
        for _ in range(max(1, runs)):
            t0 = time.perf_counter()
            graph(x)
            times.append((time.perf_counter() - t0) * 1e3)
        self.total_ms = max(1e-4, float(np.median(times)))
        self.warm = True

    def close(self) -> None:
        self._graph = None
        self.warm = False


def feeds_chain(steps: Sequence[Callable[[dict[str, Any]], list[Any]]], first_feeds: dict[str, Any],
                next_inputs: Sequence[str]) -> Callable[[], list[Any]]:
    """Run ``steps`` in order (fuse's timing): step k+1 reads step k's first output under ``next_inputs[k]``."""
    if len(steps) != len(next_inputs) + 1:
        raise ValueError("one input name per step after the first")
    if len(steps) == 1:
        only = steps[0]
        return lambda: only(first_feeds)

    def run() -> list[Any]:
        features = steps[0](first_feeds)[0]
        for step, name in strict_zip(steps[1:-1], next_inputs[:-1]):
            features = step({name: features})[0]
        return steps[-1]({next_inputs[-1]: features})

    return run
