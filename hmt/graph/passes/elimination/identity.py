"""identity: remove ops that return their input unchanged.

``Identity``; inference ``Dropout`` (one output, or an unused mask); ``Add``/``Sub`` of
zero and ``Mul``/``Div`` by one when the constant does not broadcast the other operand
to a larger shape.
"""

from __future__ import annotations

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView


def _neutral_operand(view: GraphView, node: object) -> str | None:
    import numpy as np

    op = node.op_type  # type: ignore[attr-defined]
    inputs = list(node.input)  # type: ignore[attr-defined]
    if op not in ("Add", "Sub", "Mul", "Div") or len(inputs) != 2:
        return None
    neutral = 0.0 if op in ("Add", "Sub") else 1.0
    candidates = [(inputs[0], inputs[1]), (inputs[1], inputs[0])] if op in ("Add", "Mul") else [(inputs[0], inputs[1])]
    for x, c in candidates:
        value = view.const(c)
        shape = view.shape(x)
        out_shape = view.shape(node.output[0])  # type: ignore[attr-defined]
        if value is None or shape is None or out_shape is None or None in shape or shape != out_shape:
            continue
        if view.const(x) is not None:
            continue
        if np.all(value == neutral):
            return x
    return None


@register_pass("identity", category="elimination", summary="remove Identity, inference Dropout, x+0, x*1")
def remove_identities(view: GraphView) -> int:
    fired = 0
    changed = True
    while changed:
        changed = False
        for node in list(view.graph.node):
            if node.domain not in ("", "ai.onnx"):
                continue
            keep: str | None = None
            if node.op_type == "Identity":
                keep = node.input[0]
            elif node.op_type == "Dropout":
                mask_used = len(node.output) > 1 and node.output[1] and node.output[1] in view.consumers
                training = len(node.input) > 2 and node.input[2]
                if not mask_used and not training:
                    keep = node.input[0]
            else:
                keep = _neutral_operand(view, node)
            if keep is None:
                continue
            before = len(view.graph.node)
            view.bypass(node, keep_input=keep)
            if len(view.graph.node) < before:
                fired += 1
                changed = True
                break
    return fired
