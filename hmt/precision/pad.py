"""Zero-pad narrow channel counts so ONNX Runtime's fast INT8 convolution applies.

ORT's CPU provider runs a uint8 x int8 convolution through MLAS's symmetric "indirect"
kernel (AVX2 / AVX-VNNI / AVX-512 VNNI, ARM dot product) only when the convolution has
at least 16 output channels and its input and output channel counts are multiples of 4
(``MlasConvSymPackWSize``); otherwise it falls back to im2col + a generic integer GEMM.
Narrow variants sit below that line: a 3x3 convolution of 8 channels on a 32x32 map ran
**slower** in INT8 than in FP32 on the 2-core EPYC (21.3 against 16.0 us per convolution, and
24.7 against 25.0 us at 12 channels, while 16 channels took 14.2 us in INT8;
``benchmarks/precision/results/narrow_int8_conv.json``),
so halving a variant's width left its INT8 copy no faster than FP32.

``pad_channels`` rewrites a float graph so every activation tensor of fewer than
``minimum`` channels carries ``minimum`` channels, the extra ones exactly zero:
convolution weights and biases get zero rows (new outputs) and zero columns (the padded
inputs they read), element-wise ops, pooling and spatial slices pass the zeros through
(Relu(0) = 0, 0 + 0 = 0), a channel Pad (the option-A shortcut of CIFAR ResNets) is
re-aimed at the padded width, and a Gemm head reads the padded features through zero
columns. The function of the graph is unchanged (checked numerically by the caller's
verification); INT8 then spends a few more multiply-adds on zeros and runs the fast kernel.

Only what it understands is rewritten: a padded tensor reaching any other op, a grouped
convolution or a channel slice leaves the graph untouched and says why
(:class:`PadReport`), so quantisation simply goes on without padding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

DEFAULT_MINIMUM = 16
# Ops for which a tensor whose extra channels are zero gives an output whose extra channels are zero.
_ZERO_PRESERVING = frozenset({"Relu", "Add", "GlobalAveragePool", "MaxPool", "AveragePool", "Identity"})


@dataclass
class PadReport:
    """What ``pad_channels`` did: tensors widened, or why it left the graph as it was."""

    padded: bool = False
    reason: str = ""
    widened: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"padded": self.padded, "tensors_widened": len(self.widened)}
        if self.reason:
            out["reason"] = self.reason
        if self.widened:
            out["widths"] = sorted({f"{c}->{p}" for c, p in self.widened.values()})
        return out


class _Skip(Exception):
    """The graph holds something the pass does not rewrite; the message says what."""


def padded_width(channels: int, minimum: int = DEFAULT_MINIMUM) -> int:
    """The channel count a tensor of ``channels`` carries after padding (multiples of 4, at least ``minimum``)."""
    if channels >= minimum:
        return channels if channels % 4 == 0 else channels + (-channels % 4)
    return minimum


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def pad_channels(model: onnx.ModelProto, *, minimum: int = DEFAULT_MINIMUM) -> tuple[onnx.ModelProto, PadReport]:
    """A copy of ``model`` with narrow activations zero-padded to ``minimum`` channels, and a report.

    Returns ``model`` itself (unchanged) with ``padded=False`` and a reason when nothing
    needed padding or the graph holds an op the pass does not know.
    """
    import copy

    out = copy.deepcopy(model)
    report = PadReport()
    try:
        _rewrite(out.graph, minimum, report)
    except _Skip as why:
        return model, PadReport(padded=False, reason=str(why))
    if not report.widened:
        return model, PadReport(padded=False, reason=f"no activation below {minimum} channels")
    report.padded = True
    del out.graph.value_info[:]  # shapes of widened tensors changed; ORT infers them again
    return out, report


@dataclass
class _Rewrite:
    """One pass over a graph: the tensors' widths so far, the rewritten node list, new constants."""

    graph: onnx.GraphProto
    minimum: int
    report: PadReport
    inits: dict[str, onnx.TensorProto] = field(default_factory=dict)
    # tensor -> (real channels, carried channels); absent: not an activation the pass follows
    width: dict[str, tuple[int, int]] = field(default_factory=dict)
    new_nodes: list[onnx.NodeProto] = field(default_factory=list)
    fresh: Iterator[int] = field(default_factory=lambda: iter(range(1 << 30)))

    def const(self, array: Any, stem: str) -> str:
        """Add ``array`` as a new initializer; returns its (fresh) name."""
        from onnx import numpy_helper

        name = f"{stem}__pad{next(self.fresh)}"
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def widen(self, tensor: str, channels: int, carried: int) -> None:
        """Record ``tensor``'s width, and in the report if it carries more channels than it has."""
        self.width[tensor] = (channels, carried)
        if carried != channels:
            self.report.widened[tensor] = (channels, carried)


def _rewrite(graph: onnx.GraphProto, minimum: int, report: PadReport) -> None:
    """Pad ``graph`` in place, node by node in graph order, recording what it widened in
    ``report``; raises ``_Skip`` at the first thing the pass does not rewrite."""
    rw = _Rewrite(graph, minimum, report, inits={i.name: i for i in graph.initializer})
    _pad_graph_inputs(rw)
    for node in graph.node:
        ins = [rw.width.get(i) for i in node.input]
        is_padded = any(w is not None and w[0] != w[1] for w in ins)
        op = node.op_type
        if op == "Conv":
            _rewrite_conv(rw, node, ins, is_padded)
        elif op in _ZERO_PRESERVING:
            known = [w for w in ins if w is not None]
            if op == "Add" and is_padded and (len(known) != 2 or known[0] != known[1]):
                raise _Skip(f"Add {node.name!r} joins tensors of different padding {known}")
            if known:
                rw.width[node.output[0]] = known[0]
        elif op == "Slice":
            _check_slice(rw, node, is_padded)
            if ins[0] is not None:
                rw.width[node.output[0]] = ins[0]
        elif op == "Pad" and ins[0] is not None:
            _rewrite_pad(rw, node, ins[0])
        elif op == "Flatten":
            if is_padded:
                producer = next((n for n in rw.new_nodes if node.input[0] in n.output), None)
                if producer is None or producer.op_type != "GlobalAveragePool" or _attr(node, "axis", 1) != 1:
                    raise _Skip(f"Flatten {node.name!r} of a padded tensor not after a global pool")
            if ins[0] is not None:
                rw.width[node.output[0]] = ins[0]
        elif op == "Gemm" and is_padded:
            _rewrite_gemm(rw, node, ins[0])  # type: ignore[arg-type]
        elif is_padded:
            raise _Skip(f"{op} {node.name!r} reads a padded tensor and is not one the pass rewrites")
        rw.new_nodes.append(node)
    _narrow_graph_outputs(rw)
    del graph.node[:]
    graph.node.extend(rw.new_nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]  # the narrow originals are no longer read
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _pad_graph_inputs(rw: _Rewrite) -> None:
    """Widen each narrow 4-D graph input with a Pad node (the input keeps its shape for callers)."""
    import numpy as np
    import onnx

    for gi in rw.graph.input:
        dims = gi.type.tensor_type.shape.dim
        if gi.name in rw.inits or len(dims) != 4 or not dims[1].HasField("dim_value"):
            continue
        c = dims[1].dim_value
        p = c + (-c % 4) if c < 4 else padded_width(c, rw.minimum)
        if p == c:
            rw.width[gi.name] = (c, c)
            continue
        padded = f"{gi.name}__padded"
        pads = np.zeros(8, dtype=np.int64)
        pads[5] = p - c
        rw.new_nodes.append(onnx.helper.make_node("Pad", [gi.name, rw.const(pads, "pads")], [padded], mode="constant"))
        rw.widen(padded, c, p)
        for node in rw.graph.node:
            for k, name in enumerate(node.input):
                if name == gi.name:
                    node.input[k] = padded


def _rewrite_conv(rw: _Rewrite, node: onnx.NodeProto, ins: list[tuple[int, int] | None], is_padded: bool) -> None:
    """Give a convolution zero weight rows for its new outputs and zero columns for its padded inputs."""
    import numpy as np
    from onnx import numpy_helper

    if _attr(node, "group", 1) != 1:
        if is_padded:
            raise _Skip(f"grouped convolution {node.name!r} reads a padded tensor")
        return
    inits = rw.inits
    if node.input[1] not in inits or (len(node.input) > 2 and node.input[2] and node.input[2] not in inits):
        raise _Skip(f"convolution {node.name!r} has non-constant weights")
    w = numpy_helper.to_array(inits[node.input[1]])
    co, ci = int(w.shape[0]), int(w.shape[1])
    c_in, p_in = ins[0] if ins[0] is not None else (ci, ci)
    if c_in != ci:
        raise _Skip(f"convolution {node.name!r}: weight reads {ci} channels, input has {c_in}")
    p_out = padded_width(co, rw.minimum)
    if p_out != co or p_in != ci:
        wp = np.zeros((p_out, p_in, *w.shape[2:]), dtype=w.dtype)
        wp[:co, :ci] = w
        node.input[1] = rw.const(wp, node.input[1])
        if len(node.input) > 2 and node.input[2]:
            b = numpy_helper.to_array(inits[node.input[2]])
            bp = np.zeros(p_out, dtype=b.dtype)
            bp[:co] = b
            node.input[2] = rw.const(bp, node.input[2])
    rw.widen(node.output[0], co, p_out)


def _check_slice(rw: _Rewrite, node: onnx.NodeProto, is_padded: bool) -> None:
    """A Slice may read a padded tensor only along constant axes other than the channel axis."""
    from onnx import numpy_helper

    if not is_padded:
        return
    axes_name = node.input[3] if len(node.input) > 3 else ""
    if not axes_name or axes_name not in rw.inits:
        raise _Skip(f"Slice {node.name!r} on a padded tensor has no constant axes")
    axes = [int(a) for a in numpy_helper.to_array(rw.inits[axes_name]).ravel()]
    if 1 in axes or -3 in axes:
        raise _Skip(f"Slice {node.name!r} cuts the channel axis of a padded tensor")


def _rewrite_pad(rw: _Rewrite, node: onnx.NodeProto, in_width: tuple[int, int]) -> None:
    """Re-aim a constant zero channel Pad (the option-A shortcut) at the padded width."""
    import numpy as np
    from onnx import numpy_helper

    inits = rw.inits
    if _attr(node, "mode", b"constant") not in (b"constant", "constant"):
        raise _Skip(f"Pad {node.name!r} is not a constant pad")
    if len(node.input) > 2 and node.input[2]:
        value = numpy_helper.to_array(inits[node.input[2]]) if node.input[2] in inits else None
        if value is None or float(np.asarray(value).ravel()[0]) != 0.0:
            raise _Skip(f"Pad {node.name!r} pads with a non-zero value")
    if node.input[1] not in inits or (len(node.input) > 3 and node.input[3]):
        raise _Skip(f"Pad {node.name!r} has non-constant pads or axes")
    pads = numpy_helper.to_array(inits[node.input[1]]).astype(np.int64).copy()
    rank = len(pads) // 2
    c, p = in_width
    before, after = int(pads[1]), int(pads[1 + rank])
    c_out = c + before + after
    p_out = padded_width(c_out, rw.minimum) if (p != c or c_out < rw.minimum) else c_out
    # Real channels land at [before, before + c); the input's zeros and the new tail fill the rest.
    # A negative tail (ONNX allows it) drops padding zeros past p_out: before + c <= c_out <= p_out.
    pads[1 + rank] = p_out - before - p
    if p_out != c_out or p != c:
        node.input[1] = rw.const(pads, node.input[1])
    rw.widen(node.output[0], c_out, p_out)


def _rewrite_gemm(rw: _Rewrite, node: onnx.NodeProto, in_width: tuple[int, int]) -> None:
    """Let a Gemm head read padded features through zero weight columns."""
    import numpy as np
    from onnx import numpy_helper

    if node.input[1] not in rw.inits or _attr(node, "transA", 0):
        raise _Skip(f"Gemm {node.name!r} on padded features needs constant weights, no transA")
    c, p = in_width
    b = numpy_helper.to_array(rw.inits[node.input[1]])
    trans_b = bool(_attr(node, "transB", 0))
    bp = np.zeros((b.shape[0], p) if trans_b else (p, b.shape[1]), dtype=b.dtype)
    if trans_b:
        bp[:, :c] = b
    else:
        bp[:c, :] = b
    node.input[1] = rw.const(bp, node.input[1])


def _narrow_graph_outputs(rw: _Rewrite) -> None:
    """Graph outputs keep their width: a padded one is cut back with a channel Slice."""
    import numpy as np
    import onnx

    for go in rw.graph.output:
        out_w = rw.width.get(go.name)
        if out_w is None or out_w[0] == out_w[1]:
            continue
        inner = f"{go.name}__padded"
        for node in rw.new_nodes:
            for k, name in enumerate(node.output):
                if name == go.name:
                    node.output[k] = inner
            for k, name in enumerate(node.input):
                if name == go.name:
                    node.input[k] = inner
        i64 = np.int64
        rw.new_nodes.append(onnx.helper.make_node(
            "Slice", [inner, rw.const(np.array([0], i64), "s"), rw.const(np.array([out_w[0]], i64), "e"),
                      rw.const(np.array([1], i64), "a")], [go.name]))


__all__ = ["DEFAULT_MINIMUM", "PadReport", "pad_channels", "padded_width"]
