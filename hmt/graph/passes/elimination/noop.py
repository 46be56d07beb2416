"""noop: remove shape and type ops that change nothing.

``Cast`` to the type the value already has; ``Reshape``/``Flatten``/``Squeeze``/``Unsqueeze``
whose output shape equals its input shape; ``Reshape`` of a ``Reshape`` (the first is
skipped); ``Transpose`` by the identity permutation; two ``Transpose`` that cancel.
"""

from __future__ import annotations

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView, attr


def _static(shape: tuple[int | None, ...] | None) -> bool:
    return shape is not None and None not in shape


def _step(view: GraphView) -> bool:
    for node in list(view.graph.node):
        if node.domain not in ("", "ai.onnx") or not node.input:
            continue
        op, x, out = node.op_type, node.input[0], node.output[0]
        if op == "Cast":
            dtype = view.dtype(x)
            if dtype is not None and dtype == int(attr(node, "to", -1)):
                view.bypass(node, keep_input=x)
                return True
        elif op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
            before, after = view.shape(x), view.shape(out)
            if _static(before) and before == after:
                view.bypass(node, keep_input=x)
                return True
            if op == "Reshape":
                producer = view.producer.get(x)
                if (
                    producer is not None
                    and producer.op_type == "Reshape"
                    and id(view.only_consumer(x)) == id(node)
                    and not int(attr(node, "allowzero", 0))
                    and _static(view.shape(out))
                ):
                    node.input[0] = producer.input[0]
                    view.remove(producer)
                    view.refresh()
                    return True
        elif op == "Transpose":
            perm = attr(node, "perm")
            if perm is not None and list(perm) == list(range(len(perm))):
                view.bypass(node, keep_input=x)
                return True
            producer = view.producer.get(x)
            if perm is not None and producer is not None and producer.op_type == "Transpose":
                first = attr(producer, "perm")
                if first is not None and len(first) == len(perm) and [first[p] for p in perm] == list(
                    range(len(perm))
                ):
                    before_count = len(view.graph.node)
                    view.bypass(node, keep_input=producer.input[0])
                    if len(view.graph.node) < before_count:
                        view.prune()
                        return True
    return False


@register_pass("noop", category="elimination", summary="remove same-type Cast, same-shape Reshape, inverse Transposes")
def remove_noops(view: GraphView) -> int:
    fired = 0
    while _step(view):
        fired += 1
    return fired
