"""element-wise: merge chains of element-wise ops into fewer ops.

- ``(x + c1) + c2`` -> ``x + (c1 + c2)`` (``Sub`` by a constant counts as ``Add``);
- ``(x * c1) * c2`` -> ``x * (c1 * c2)`` (``Div`` by a float constant counts as ``Mul``);
- activations that compose into one: ``Relu(Relu x)``, ``Clip(Relu x)``, ``Relu(Clip x)``,
  ``Clip(Clip x)``;
- ``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5) -> ``HardSwish`` (opset 14+).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView, apply_until_fixed, attr

if TYPE_CHECKING:
    import numpy as np
    import onnx


def _affine_operand(view: GraphView, node: onnx.NodeProto, kind: str) -> tuple[str, np.ndarray] | None:
    """(dynamic input, constant as a value to Add/Mul) if ``node`` is x op c of ``kind``."""
    import numpy as np

    ops = {"add": ("Add", "Sub"), "mul": ("Mul", "Div")}[kind]
    if node.op_type not in ops or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    a, b = node.input
    ca, cb = view.const(a), view.const(b)
    if cb is not None and ca is None:
        x, c = a, cb
    elif ca is not None and cb is None and node.op_type in ("Add", "Mul"):
        x, c = b, ca
    else:
        return None
    if not np.issubdtype(c.dtype, np.floating):
        return None
    if node.op_type == "Sub":
        c = -c
    elif node.op_type == "Div":
        if np.any(c == 0):
            return None
        c = (1.0 / c.astype(np.float64)).astype(c.dtype)
    return x, c


def _merge_affine(view: GraphView) -> bool:
    import onnx

    for kind, op in (("add", "Add"), ("mul", "Mul")):
        for first in list(view.graph.node):
            head = _affine_operand(view, first, kind)
            if head is None:
                continue
            second = view.only_consumer(first.output[0])
            if second is None:
                continue
            tail = _affine_operand(view, second, kind)
            if tail is None or tail[0] != first.output[0]:
                continue
            x, c1 = head
            c = c1 + tail[1] if kind == "add" else c1 * tail[1]
            name = view.add_initializer((first.name or op) + "_c", c.astype(c1.dtype))
            merged = onnx.helper.make_node(op, [x, name], [second.output[0]], name=(first.name or op) + "_merged")
            view.replace_output_producer(first, merged)
            view.remove(first, second)
            view.refresh()
            return True
    return False


def _clip_bounds(view: GraphView, node: onnx.NodeProto) -> tuple[float, float] | None:
    import numpy as np

    if node.op_type == "Relu":
        return 0.0, float("inf")
    if node.op_type != "Clip":
        return None
    if view.opset < 11:
        return float(attr(node, "min", -np.inf)), float(attr(node, "max", np.inf))
    lo = view.const(node.input[1]) if len(node.input) > 1 and node.input[1] else np.array(-np.inf)
    hi = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.array(np.inf)
    if lo is None or hi is None or lo.size != 1 or hi.size != 1:
        return None
    return float(lo.reshape(-1)[0]), float(hi.reshape(-1)[0])


def _merge_clamps(view: GraphView) -> bool:
    import numpy as np
    import onnx

    for first in list(view.graph.node):
        if first.domain not in ("", "ai.onnx"):
            continue
        b1 = _clip_bounds(view, first)
        if b1 is None:
            continue
        second = view.only_consumer(first.output[0])
        if second is None or second.domain not in ("", "ai.onnx") or second.input[0] != first.output[0]:
            continue
        b2 = _clip_bounds(view, second)
        if b2 is None:
            continue
        lo, hi = max(b1[0], b2[0]), min(b1[1], b2[1])
        if lo > hi:
            continue
        x, out = first.input[0], second.output[0]
        if lo == 0.0 and hi == float("inf"):
            node = onnx.helper.make_node("Relu", [x], [out], name=(first.name or "relu") + "_merged")
        elif view.opset >= 11:
            inputs = [x, view.add_initializer("clip_min", np.array(lo, dtype=np.float32))]
            if hi != float("inf"):
                inputs.append(view.add_initializer("clip_max", np.array(hi, dtype=np.float32)))
            node = onnx.helper.make_node("Clip", inputs, [out], name=(first.name or "clip") + "_merged")
        else:
            node = onnx.helper.make_node("Clip", [x], [out], name=(first.name or "clip") + "_merged", min=lo, max=hi)
        view.replace_output_producer(first, node)
        view.remove(first, second)
        view.refresh()
        return True
    return False


def _hardswish(view: GraphView) -> bool:
    import onnx

    if view.opset < 14:
        return False
    for hs in view.nodes("HardSigmoid"):
        if abs(float(attr(hs, "alpha", 0.2)) - 1 / 6) > 1e-6 or abs(float(attr(hs, "beta", 0.5)) - 0.5) > 1e-6:
            continue
        mul = view.only_consumer(hs.output[0])
        x = hs.input[0]
        if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([x, hs.output[0]]):
            continue
        node = onnx.helper.make_node("HardSwish", [x], [mul.output[0]], name=(hs.name or "hardswish") + "_fused")
        view.replace_output_producer(hs, node)
        view.remove(hs, mul)
        view.refresh()
        return True
    return False


@register_pass(
    "element-wise",
    category="fusion",
    summary="merge chains of constant Add/Sub, Mul/Div, Relu/Clip and x*HardSigmoid(x)",
)
def fuse_elementwise(view: GraphView) -> int:
    return apply_until_fixed(view, (_merge_affine, _merge_clamps, _hardswish))
