"""Run one bundled variant as its chain of static graphs, with early exit by confidence.

A variant is ``segment_0 .. segment_s`` plus one exit head per segment (``hmt.bundle``).
:class:`ChainRunner` feeds the input through the segments in order; after segment ``k``
it runs ``exit_k`` and stops when the head's softmax confidence reaches the threshold,
else it goes on, up to the variant's ``exit_stage`` whose answer is always taken. With
early exit off only the last head runs.

Engines: ONNX Runtime (``onnxruntime``) or the TVM runtime (``tvm``, the shared
libraries compiled for the bundle's target). ``auto`` takes the variant's
``preferred_engine`` when its runtime imports here, else ONNX Runtime. Neither path
imports torch; TVM's FFI layer imports torch opportunistically when it is installed,
so the TVM import below hides torch from it (the serve process never needs it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.bundle import Bundle, BundleVariant, GraphSpec
from hmt.errors import DeviceError, ModelError, UsageError

GraphFn = Callable[[np.ndarray], np.ndarray]

_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
           "int32": np.int32, "uint8": np.uint8, "int8": np.int8}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of a bundle ``TensorSpec.dtype``."""
    try:
        return np.dtype(_DTYPES[name])
    except KeyError as exc:
        raise ModelError(f"bundle tensor dtype {name!r} is not supported; expected one of {sorted(_DTYPES)}") from exc


def runtime_available(engine: str) -> bool:
    """Whether ``engine``'s runtime can be imported here (without importing it)."""
    module = {"onnxruntime": "onnxruntime", "tvm": "tvm"}.get(engine)
    if module is None:
        raise UsageError(f"unknown engine {engine!r}; expected onnxruntime or tvm")
    return importlib.util.find_spec(module) is not None


def resolve_engine(requested: str, variant: BundleVariant) -> str:
    """The engine to run ``variant`` with for ``requested`` (``auto``, ``onnxruntime`` or ``tvm``)."""
    if requested == "auto":
        preferred = variant.preferred_engine
        if preferred in variant.engines and runtime_available(preferred):
            return preferred
        return "onnxruntime"
    if requested not in ("onnxruntime", "tvm"):
        raise UsageError(f"engine must be auto, onnxruntime or tvm, got {requested!r}")
    if requested == "tvm" and "tvm" not in variant.engines:
        raise UsageError(f"variant {variant.arch_id!r} has no TVM libraries in this bundle (engines: "
                         f"{list(variant.engines)}); use --engine onnxruntime or auto")
    if not runtime_available(requested):
        raise DeviceError(f"engine {requested!r} requested but its runtime is not installed here")
    return requested


def ort_graph(path: Path, threads: int) -> GraphFn:
    """One ONNX graph under ONNX Runtime on the CPU (single input, first output)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning worker threads burn a core between requests; on a small shared device
    # that steals the very CPU the load index is measuring.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(f"{path}: ONNX Runtime cannot load the graph ({exc})") from exc
    input_name = session.get_inputs()[0].name

    def run(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = session.run(None, {input_name: x})[0]
        return out

    return run


@contextlib.contextmanager
def _torch_hidden() -> Iterator[None]:
    # tvm_ffi imports torch when it is installed (for DLPack interop serve does not use);
    # an entry of None makes that import fail fast, which tvm_ffi tolerates.
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def tvm_graph(path: Path, threads: int) -> GraphFn:
    """One TVM Relax module exported as a shared library, on the CPU.

    The VM is not documented as safe to call from several threads at once, so each
    calling thread gets its own VM over the shared loaded module. ``threads`` sets
    TVM_NUM_THREADS before the runtime starts its pool (the first TVM load of the process
    wins): TVM's pool workers spin while idle, which reads as a fully busy CPU to the
    load index, so small graphs are better served by one thread per request.
    """
    if threads > 0:
        os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    try:
        with _torch_hidden():
            import tvm
            from tvm import relax
    except Exception as exc:
        raise DeviceError(f"the TVM runtime cannot be imported ({exc})") from exc
    dev = tvm.cpu(0)
    try:
        module = tvm.runtime.load_module(str(path))
        relax.VirtualMachine(module, dev)  # fail here, at load, not on the first request
    except Exception as exc:
        raise ModelError(f"{path}: TVM cannot load the module ({exc})") from exc
    local = threading.local()

    def run(x: np.ndarray) -> np.ndarray:
        main = getattr(local, "main", None)
        if main is None:
            main = local.main = relax.VirtualMachine(module, dev)["main"]
        out = main(tvm.runtime.tensor(x, dev))
        while not hasattr(out, "numpy"):  # a tuple of outputs: the first is the answer
            out = out[0]
        result: np.ndarray = out.numpy()
        return result

    return run


def softmax_confidence(logits: np.ndarray) -> tuple[int, float]:
    """Arg-max class and its softmax probability of one row of logits (numerically stable)."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    if row.size == 0 or not np.all(np.isfinite(row)):
        raise ModelError("an exit head produced empty or non-finite logits")
    shifted = row - row.max()
    weights = np.exp(shifted)
    best = int(np.argmax(row))
    return best, float(weights[best] / weights.sum())


@dataclass(frozen=True)
class ChainResult:
    class_index: int
    confidence: float
    exit: int  # segment whose head answered
    compute_ms: float
    predicted_share: float  # share of the longest path's warm time this run spent (for r)


class ChainRunner:
    """A loaded variant: ``run(x)`` answers one input; ``warm()`` times every graph."""

    def __init__(self, variant: BundleVariant, segments: list[GraphFn], exits: list[GraphFn], engine: str) -> None:
        self.variant = variant
        self.arch_id = variant.arch_id
        self.exit_stage = variant.exit_stage
        self.engine = engine
        self._segments = segments[: variant.exit_stage + 1]
        self._exits = exits[: variant.exit_stage + 1]
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
            class_index, conf = softmax_confidence(self._exits[k](features))
            spent_ms += self.exit_ms[k]
            if k == last or conf >= confidence:  # type: ignore[operator]
                elapsed_ms = (time.perf_counter() - start) * 1e3
                return ChainResult(class_index, conf, k, elapsed_ms, spent_ms / self.full_ms(confidence is not None))
        raise AssertionError("unreachable: the last exit always answers")

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


def graph_fn(bundle: Bundle, spec: GraphSpec, engine: str, threads: int) -> GraphFn:
    """One graph of ``bundle`` loaded with ``engine`` ("onnxruntime" or "tvm"), as serve runs it."""
    if engine == "tvm":
        if spec.tvm is None:
            raise ModelError(f"graph {spec.onnx} has no TVM library in this bundle")
        return tvm_graph(bundle.path(spec.tvm), threads)
    return ort_graph(bundle.path(spec.onnx), threads)


def load_runner(bundle: Bundle, arch_id: str, engine: str = "auto", threads: int = 1) -> ChainRunner:
    """Load ``arch_id`` of ``bundle`` (every graph up to its ``exit_stage``) with ``engine``."""
    if threads < 0:
        raise UsageError(f"threads must be >= 0 (0: the runtime's default), got {threads}")
    variant = bundle.spec.variant(arch_id)
    chosen = resolve_engine(engine, variant)
    n = variant.exit_stage + 1
    segments = [graph_fn(bundle, g, chosen, threads) for g in variant.segments[:n]]
    exits = [graph_fn(bundle, g, chosen, threads) for g in variant.exits[:n]]
    return ChainRunner(variant, segments, exits, chosen)


def example_input(bundle: Bundle, rng: np.random.Generator | None = None) -> np.ndarray:
    """An input of the bundle's shape and dtype: seeded noise, or zeros without ``rng``."""
    spec = bundle.spec.input
    dtype = numpy_dtype(spec.dtype)
    if rng is None:
        return np.zeros(spec.shape, dtype=dtype)
    return rng.standard_normal(spec.shape).astype(dtype)
