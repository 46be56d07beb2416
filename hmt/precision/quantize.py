"""INT8 static quantisation and FP16 conversion of ONNX graphs (ONNX Runtime's own tools).

INT8: ``onnxruntime.quantization.quantize_static`` in QDQ form (QuantizeLinear /
DequantizeLinear pairs around each quantised op, which ORT's CPU provider fuses into
integer kernels and TensorRT reads as explicit quantisation), weights per output channel,
activation ranges calibrated (min/max) on the supernet's stored calibration images: for
the segment graphs of an early-exit chain, segment k is calibrated on what the float
chain feeds it (segment k-1's output on those images), and each exit head on its
segment's output.

Narrow graphs are first zero-padded to 16 channels (``hmt.precision.pad``): ORT's fast
symmetric INT8 convolution needs at least 16 output channels, and below that INT8 ran no
faster than FP32 (``QuantOptions.pad_channels``; 0 turns it off). Padding also spends
multiply-adds on zeros, so by default both INT8 graphs are made and timed here and the
padded one is kept only where it ran faster (``pad_policy="measure"``).

FP16: ``onnxruntime.transformers.float16`` with fp32 inputs and outputs kept (a cast at
each end), so a chain mixes precisions freely and serve feeds the same arrays. FP16 is
for GPU providers (CUDA, TensorRT); ORT's CPU provider runs most fp16 ops by casting.

Both return new ``onnx.ModelProto`` objects; the float graph is left untouched.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.errors import ModelError, UsageError
from hmt.precision import FP16, FP32, INT8, check_precision

if TYPE_CHECKING:
    import numpy as np
    import onnx

ACTIVATION_TYPES = ("uint8", "int8")
PAD_POLICIES = ("measure", "always")


@dataclass(frozen=True)
class QuantOptions:
    """How INT8 graphs are made. ``activation``: uint8 (U8S8, the x86 VNNI path) or int8 (S8S8)."""

    per_channel: bool = True
    activation: str = "uint8"
    calibration_samples: int = 256
    # Reduced 7-bit weight range keeps U8S8 exact on CPUs without VNNI (the AVX2 path
    # saturates 16-bit sums); off by default: VNNI machines and ARM dot-product cores don't need it.
    reduce_range: bool = False
    # Zero-pad activations of fewer channels to this many before quantising (0: off), so ORT's
    # fast symmetric INT8 convolution applies to narrow variants (hmt.precision.pad says why).
    pad_channels: int = 16
    # "measure": keep the padded graph only where it ran faster than the plain one on this host
    # (both quantised, timed in one loop); "always": keep it whenever the pass applies.
    pad_policy: str = "measure"

    def validate(self) -> QuantOptions:
        if self.activation not in ACTIVATION_TYPES:
            raise UsageError(f"activation type {self.activation!r}: expected one of {', '.join(ACTIVATION_TYPES)}")
        if self.pad_policy not in PAD_POLICIES:
            raise UsageError(f"pad policy {self.pad_policy!r}: expected one of {', '.join(PAD_POLICIES)}")
        if self.pad_channels < 0:
            raise UsageError(f"pad channels must be >= 0 (0: off), got {self.pad_channels}")
        if self.calibration_samples < 1:
            raise UsageError(f"calibration samples must be >= 1, got {self.calibration_samples}")
        return self

    def to_json(self) -> dict[str, Any]:
        return {"format": "QDQ", "per_channel": self.per_channel, "activation": self.activation,
                "weights": "int8", "calibration": "minmax", "calibration_samples": self.calibration_samples,
                "reduce_range": self.reduce_range, "pad_channels": self.pad_channels,
                "pad_policy": self.pad_policy}


def _input_name(model: onnx.ModelProto) -> str:
    initializers = {i.name for i in model.graph.initializer}
    names = [v.name for v in model.graph.input if v.name not in initializers]
    if len(names) != 1:
        raise ModelError(f"quantisation expects graphs of one input, this one has {len(names)}: {names}")
    return names[0]


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """ORT's quantiser logs advice ("consider pre-processing") on the root logger at every call;
    hmt never prints, so warnings are held back for the call and the level restored after."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def quantize_int8(model: onnx.ModelProto, calibration: Sequence[np.ndarray], *,
                  options: QuantOptions | None = None) -> onnx.ModelProto:
    """A QDQ INT8 copy of ``model`` calibrated on ``calibration`` (one array per run, the graph's input shape)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    options = (options or QuantOptions()).validate()
    if not calibration:
        raise UsageError("INT8 calibration needs at least one input sample")
    name = _input_name(model)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._items: Iterator[np.ndarray] = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            item = next(self._items, None)
            return None if item is None else {name: item}

    activation = QuantType.QUInt8 if options.activation == "uint8" else QuantType.QInt8

    def quantise(graph: onnx.ModelProto) -> onnx.ModelProto:
        with tempfile.TemporaryDirectory(prefix="hmt-quant-") as tmp, _quiet_root_logger():
            src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
            onnx.save(graph, str(src))
            try:
                quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ,
                                per_channel=options.per_channel, reduce_range=options.reduce_range,
                                activation_type=activation, weight_type=QuantType.QInt8,
                                calibration_providers=["CPUExecutionProvider"])
            except Exception as exc:  # ORT raises plain exceptions of several types on unsupported graphs
                raise ModelError(f"INT8 quantisation failed: {type(exc).__name__}: {exc}") from exc
            return onnx.load(str(dst))

    plain = quantise(model)
    if not options.pad_channels:
        return plain
    padded_float = _padded_if_equal(model, calibration[0], options.pad_channels)
    if padded_float is model:
        return plain
    padded = quantise(padded_float)
    if options.pad_policy == "always":
        return padded
    # "measure": padding buys the fast kernel but adds multiply-adds on zeros (and a Pad / Slice
    # where a narrow tensor enters or leaves the graph); keep it only where it ran faster here.
    return padded if _faster(padded, plain, calibration[0]) else plain


def _faster(candidate: onnx.ModelProto, baseline: onnx.ModelProto, x: np.ndarray, *, margin: float = 0.03) -> bool:
    """Whether ``candidate`` runs at least ``margin`` faster than ``baseline`` on ``x`` (ORT CPU, 1 thread).

    Both alternate in one loop (bursts, as fuse times), so background load hits both alike."""
    import onnxruntime as ort

    from hmt.fuse.engines.timing import measure_alternating

    def runner(model: onnx.ModelProto) -> Callable[[], object]:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feeds = {_input_name(model): x}
        return lambda: session.run(None, feeds)

    timings = measure_alternating({"candidate": runner(candidate), "baseline": runner(baseline)}, warmup=5,
                                  repeats=40, burst=8, drop_slower_than=None)
    return timings["candidate"].median_ms < (1.0 - margin) * timings["baseline"].median_ms


def _padded_if_equal(model: onnx.ModelProto, sample: np.ndarray, minimum: int) -> onnx.ModelProto:
    """``model`` with narrow channels zero-padded, if the padded graph computes the same outputs on ``sample``.

    The pass is exact by construction; the check guards against a graph shape it misreads
    (then the unpadded graph is quantised: slower on narrow layers, never wrong).
    """
    import numpy as np

    from hmt.precision.pad import pad_channels

    padded, report = pad_channels(model, minimum=minimum)
    if not report.padded:
        return model
    try:
        want = _run_all(model, sample)
        got = _run_all(padded, sample)
    except Exception:  # noqa: BLE001 - ORT refuses the padded graph: keep the original
        return model
    for a, b in zip(want, got, strict=True):
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(a).max()))):
            return model
    return padded


def _run_all(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, {_input_name(model): x})]


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """An FP16 copy of ``model`` that still takes and returns fp32 tensors."""
    import copy

    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        converted: onnx.ModelProto = convert_float_to_float16(copy.deepcopy(model), keep_io_types=True)
    except Exception as exc:
        raise ModelError(f"FP16 conversion failed: {type(exc).__name__}: {exc}") from exc
    _sort_nodes(converted.graph)  # the converter appends its input casts last; checkers want topological order
    return converted


def _sort_nodes(graph: onnx.GraphProto) -> None:
    """Reorder ``graph``'s nodes topologically (stable: the original order among ready nodes)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise ModelError(f"graph {graph.name!r} has a cycle or an undefined input after FP16 conversion")
        for node in ready:
            available.update(node.output)
        ready_ids = {id(n) for n in ready}
        ordered.extend(ready)
        pending = [n for n in pending if id(n) not in ready_ids]
    copies = [type(n)() for n in ordered]
    for dst, src in zip(copies, ordered, strict=True):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(copies)


def float_features(model: onnx.ModelProto, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``model``'s first output for each input (ORT, CPU): what the next graph of a chain is fed."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    name = _input_name(model)
    return [session.run(None, {name: x})[0] for x in inputs]


def quantize_chain(segments: Sequence[onnx.ModelProto], exits: Sequence[onnx.ModelProto], samples: np.ndarray,
                   precision: str, *, options: QuantOptions | None = None, batched: bool = False
                   ) -> tuple[list[onnx.ModelProto], list[onnx.ModelProto]]:
    """The segments and exit heads of one variant at ``precision``.

    ``samples``: normalised calibration inputs, shape (N, *segment 0's input shape without
    its batch dimension); the graphs are static, so each sample runs as a batch of one.
    ``batched``: ``samples`` is (N, *segment 0's full input shape) instead, for graphs
    exported at a batch size above one.
    """
    options = (options or QuantOptions()).validate()
    check_precision(precision)
    if len(segments) != len(exits) or not segments:
        raise ModelError(f"a chain needs one exit head per segment, got {len(segments)} and {len(exits)}")
    if precision == FP32:
        return list(segments), list(exits)
    if precision == FP16:
        return [to_fp16(m) for m in segments], [to_fp16(m) for m in exits]
    assert precision == INT8
    kept = samples[: options.calibration_samples]
    feed = [(x if batched else x[None, ...]).astype("float32", copy=False) for x in kept]
    q_segments, q_exits = [], []
    for segment, head in zip(segments, exits, strict=True):
        q_segments.append(quantize_int8(segment, feed, options=options))
        feed = float_features(segment, feed)
        q_exits.append(quantize_int8(head, feed, options=options))
    return q_segments, q_exits


__all__ = ["ACTIVATION_TYPES", "PAD_POLICIES", "QuantOptions", "float_features", "quantize_chain", "quantize_int8",
           "to_fp16"]
