"""Timing of models on the engine serve uses (ONNX Runtime by default), with conditions.

Each measurement records warm-up, repetitions, median and spread, and the conditions
during the timed window: mean CPU frequency and the *background* CPU utilisation (CPU
time of every other process, from system-wide minus this process's CPU time), which is
what the load index of serve sees.
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hmt.errors import DeviceError, ModelError
from hmt.profile.facts import current_freq_mhz
from hmt.profile.parsers import spread

if TYPE_CHECKING:
    import torch

ONNX_OPSET = 17


@dataclass(frozen=True)
class Conditions:
    freq_mhz: float | None
    background_util: float  # other processes' share of all cores during the window, [0, 1]
    wall_s: float


@dataclass(frozen=True)
class Measurement:
    median_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float
    n: int
    warmup: int
    conditions: Conditions
    when_utc: str
    # Time per call under sustained load (``sustained_ms``); None where only per-call figures exist.
    sustained_ms: float | None = None

    @property
    def sustained_or_median_ms(self) -> float:
        return self.median_ms if self.sustained_ms is None else self.sustained_ms

    def row(self) -> dict[str, Any]:
        return {
            "latency_ms": self.median_ms, "p10_ms": self.p10_ms, "p90_ms": self.p90_ms, "iqr_ms": self.iqr_ms,
            "sustained_ms": float("nan") if self.sustained_ms is None else self.sustained_ms,
            "repeats": self.n, "warmup": self.warmup, "freq_mhz": self.conditions.freq_mhz or float("nan"),
            "background_util": self.conditions.background_util, "when_utc": self.when_utc,
        }


ROW_UNITS = {"latency_ms": "ms", "p10_ms": "ms", "p90_ms": "ms", "iqr_ms": "ms", "sustained_ms": "ms",
             "repeats": "count", "warmup": "count", "freq_mhz": "MHz", "background_util": "fraction",
             "when_utc": "ISO-8601"}


def _busy_seconds(times: Any) -> float:
    return float(times.user + times.system + getattr(times, "nice", 0.0) + getattr(times, "irq", 0.0)
                 + getattr(times, "softirq", 0.0))


@contextmanager
def conditions_meter() -> Iterator[list[Conditions]]:
    """Yields a list that holds the window's Conditions once the block exits."""
    import os

    import psutil

    me = psutil.Process()
    cores = os.cpu_count() or 1
    out: list[Conditions] = []
    f0 = current_freq_mhz()
    sys0, self0, t0 = _busy_seconds(psutil.cpu_times()), sum(me.cpu_times()[:2]), time.perf_counter()
    try:
        yield out
    finally:
        wall = time.perf_counter() - t0
        sys1, self1 = _busy_seconds(psutil.cpu_times()), sum(me.cpu_times()[:2])
        f1 = current_freq_mhz()
        other = max(0.0, (sys1 - sys0) - (self1 - self0))
        util = min(1.0, other / (wall * cores)) if wall > 0 else 0.0
        freq = (f0 + f1) / 2 if f0 is not None and f1 is not None else (f0 or f1)
        out.append(Conditions(freq, util, wall))


def export_onnx_bytes(module: torch.nn.Module, input_shape: Sequence[int], *, batch: int = 1) -> bytes:
    """Export ``module`` (eval) to ONNX in memory with a fixed input shape."""
    import torch

    example = torch.zeros((batch, *input_shape))
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            torch.onnx.export(  # the TorchScript exporter (dynamo=False) writes to file objects
                module.eval(), (example,), buffer,  # type: ignore[arg-type]
                dynamo=False, input_names=["x"], output_names=["y"],
                opset_version=ONNX_OPSET,
            )
    except Exception as exc:
        raise ModelError(f"cannot export {type(module).__name__} at shape {tuple(example.shape)} to ONNX: {exc}") \
            from exc
    return buffer.getvalue()


def identity_onnx_bytes(shape: Sequence[int], *, op: str = "Identity") -> bytes:
    """A one-node pass-through model (Identity, or a cheap element-wise ``op`` for engines that
    reject a function returning its own input): timing it gives the engine's fixed cost per run."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "pass_through", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


class Runner(Protocol):
    """What the block table, probes, load model, calibration and validation time models with.

    ``prepare`` returns a zero-argument callable running one inference on a fixed input of
    ``shape`` (batch included), which returns only once the result is ready (a CUDA run
    synchronises the device), so it can be timed from outside; ``time`` measures it;
    ``overhead_ms`` is the engine's fixed cost per run at that input size (a model that only
    passes its input through). A runner whose ``prepare`` cannot give such a callable sets
    ``interleaves = False`` and its variants are timed one after the other (``validate``).
    """

    engine: str
    version: str

    def prepare(self, module: torch.nn.Module, shape: Sequence[int], *, seed: int = 0) -> Callable[[], object]: ...

    def time(self, module: torch.nn.Module, shape: Sequence[int], *, warmup: int, repeats: int) -> Measurement: ...

    def overhead_ms(self, shape: Sequence[int], *, warmup: int, repeats: int) -> float: ...


def _input(shape: Sequence[int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(tuple(shape)).astype(np.float32)


class OrtRunner:
    """ONNX Runtime (CPU, or CUDA when ``device='cuda'`` and onnxruntime-gpu is installed).

    Each module is exported to ONNX in memory at its fixed input shape, then timed.
    """

    engine = "onnxruntime"

    def __init__(self, *, threads: int | None = None, device: str = "cpu") -> None:
        import onnxruntime as ort

        self.threads = threads
        self.device = device
        available = ort.get_available_providers()
        if device == "cuda":
            if "CUDAExecutionProvider" not in available:
                raise DeviceError(
                    f"ONNX Runtime has no CUDAExecutionProvider here (providers: {available}); "
                    "install onnxruntime-gpu, or time with --engine torch"
                )
            self.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        else:
            self.providers = ["CPUExecutionProvider"]
        self.version = ort.__version__

    def session(self, onnx_bytes: bytes) -> Callable[[np.ndarray], object]:
        from hmt.runtime.ort import OrtOptions, ort_session

        # ORT's defaults but for the thread count (its default level is "all").
        session = ort_session(onnx_bytes, OrtOptions(intra_op_threads=self.threads or 0),
                              providers=tuple(self.providers), what="the model")
        run = session.graph_fn()
        return lambda x: run(x)

    def prepare(self, module: torch.nn.Module, shape: Sequence[int], *, seed: int = 0) -> Callable[[], object]:
        run = self.session(export_onnx_bytes(module, shape[1:], batch=shape[0]))
        x = _input(shape, seed)
        return lambda: run(x)

    def time(self, module: torch.nn.Module, shape: Sequence[int], *, warmup: int, repeats: int) -> Measurement:
        return time_callable(self.prepare(module, shape), warmup=warmup, repeats=repeats)

    def overhead_ms(self, shape: Sequence[int], *, warmup: int, repeats: int) -> float:
        run = self.session(identity_onnx_bytes(shape))
        x = _input(shape, 0)
        return time_callable(lambda: run(x), warmup=warmup, repeats=repeats).sustained_or_median_ms


class TorchRunner:
    """Eager torch on CPU or CUDA (synchronised after each run): the GPU path when ONNX
    Runtime has no CUDA provider."""

    engine = "torch"

    def __init__(self, *, device: str = "cpu", threads: int | None = None) -> None:
        import torch

        if device == "cuda" and not torch.cuda.is_available():
            raise DeviceError("--processor cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
        if threads:
            torch.set_num_threads(threads)
        self.device = device
        self.version = torch.__version__.split("+")[0]

    def prepare(self, module: torch.nn.Module, shape: Sequence[int], *, seed: int = 0) -> Callable[[], object]:
        import torch

        model = (copy.deepcopy(module) if self.device != "cpu" else module).to(self.device).eval()
        x = torch.from_numpy(_input(shape, seed)).to(self.device)
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)

        def run() -> object:
            with torch.inference_mode():
                out = model(x)
            sync()
            return out

        return run

    def time(self, module: torch.nn.Module, shape: Sequence[int], *, warmup: int, repeats: int) -> Measurement:
        return time_callable(self.prepare(module, shape), warmup=warmup, repeats=repeats)

    def overhead_ms(self, shape: Sequence[int], *, warmup: int, repeats: int) -> float:
        from torch import nn

        return self.time(nn.Identity(), shape, warmup=warmup, repeats=repeats).sustained_or_median_ms


MIN_WINDOW_S = 0.2
MAX_REPEATS = 20000
# A burst of back-to-back calls lasts at least this long (``sustained_ms``): many times any CPU budget's
# enforcement cycle (a device class's 1 ms pacer) so a burst's mean sees the budget, not one cycle's phase.
BURST_S = 0.02
SCHEDSTAT = "/proc/thread-self/schedstat"


def run_delay_ms(path: str = SCHEDSTAT) -> float:
    """Time this thread has spent runnable but waiting for a CPU (Linux schedstat), in ms; 0 where unknown."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass(frozen=True)
class Burst:
    calls: int
    wall_ms: float  # the calls' own time, back to back
    waiting_ms: float  # of which the thread was runnable but not running (other processes had the CPU)


def sustained_ms(samples_ms: Sequence[float], *, burst_ms: float = BURST_S * 1e3) -> float:
    """Time per call under sustained load, from per-call times alone (no wait accounting): the calls
    cut into bursts of at least ``burst_ms``; each burst's mean; the median over bursts. See
    :func:`sustained_from_bursts`. Fewer samples than one burst: their mean."""
    if not samples_ms:
        raise ValueError("no samples")
    bursts: list[Burst] = []
    total, count = 0.0, 0
    for sample in samples_ms:
        total += sample
        count += 1
        if total >= burst_ms:
            bursts.append(Burst(count, total, 0.0))
            total, count = 0.0, 0
    return sustained_from_bursts(bursts or [Burst(count, total, 0.0)])


def sustained_from_bursts(bursts: Sequence[Burst]) -> float:
    """Time per call under sustained load: per burst of back-to-back calls, (wall - waiting) / calls;
    the median over bursts.

    A per-call median says how fast a call runs when it runs. Where the CPU is granted in slices (a
    CPU budget kept by a pacer, as an emulated device class has), a call much shorter than a slice
    mostly runs unthrottled and the stall lands on a few calls, so the median misses it, while a model
    made of such calls, run end to end, pays it in full. A burst's mean pays it as the model does. The
    time the thread waited, runnable, while other processes had the CPU is not the device's speed (a
    shared machine's neighbours; a model run once mostly slips between them) and is taken out; a
    stopped (frozen) class is not runnable, so its stalls stay in. The median over bursts drops a
    burst that something unrelated interrupted. On a CPU of its own it reads what the median reads."""
    if not bursts:
        raise ValueError("no bursts")
    return float(np.median([max(0.0, b.wall_ms - b.waiting_ms) / b.calls for b in bursts]))


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def time_callable(fn: Callable[[], object], *, warmup: int, repeats: int,
                  min_window_s: float | None = None) -> Measurement:
    """Time ``fn`` after ``warmup`` calls: at least ``repeats`` runs and at least ``min_window_s``.

    The window floor keeps the conditions meaningful: CPU times tick at 10 ms, so a window
    of a few runs of a 10 us layer would read background load as 0 or 100%.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    min_window_s = MIN_WINDOW_S if min_window_s is None else min_window_s
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    bursts: list[Burst] = []
    burst_calls, burst_ms, waited_at = 0, 0.0, run_delay_ms()
    with conditions_meter() as cond:
        deadline = time.perf_counter() + min_window_s
        while len(samples) < repeats or (time.perf_counter() < deadline and len(samples) < MAX_REPEATS):
            start = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - start) / 1e6)
            burst_calls, burst_ms = burst_calls + 1, burst_ms + samples[-1]
            if burst_ms >= BURST_S * 1e3:
                waited = run_delay_ms()
                bursts.append(Burst(burst_calls, burst_ms, waited - waited_at))
                burst_calls, burst_ms, waited_at = 0, 0.0, waited
    if burst_calls and not bursts:
        bursts.append(Burst(burst_calls, burst_ms, run_delay_ms() - waited_at))
    s = spread(samples)
    return Measurement(s.median, s.p10, s.p90, s.iqr, s.n, warmup, cond[0], utc_now(),
                       sustained_from_bursts(bursts))
