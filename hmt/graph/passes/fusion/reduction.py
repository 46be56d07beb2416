"""reduction: map reductions onto fewer, specialised ops.

- ``ReduceMean`` over every spatial axis of an NC... tensor -> ``GlobalAveragePool``
  (plus ``Flatten`` when ``keepdims=0``);
- two consecutive reductions of the same kind (Sum, Mean, Max, Min) with
  ``keepdims=1`` on the first -> one reduction over the union of axes;
- a zero constant ``Pad`` on the spatial axes before ``AveragePool`` (counting pads)
  -> the pool's own ``pads``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView, apply_until_fixed, attr, set_attr

if TYPE_CHECKING:
    import onnx

_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")


def _axes(view: GraphView, node: onnx.NodeProto) -> list[int] | None:
    """Normalised axes of a reduction (None when unknown or 'all axes')."""
    shape = view.shape(node.input[0])
    if shape is None:
        return None
    new_style = (node.op_type == "ReduceSum" and view.opset >= 13) or view.opset >= 18
    if new_style:
        if len(node.input) < 2 or not node.input[1]:
            return None
        value = view.const(node.input[1])
        if value is None:
            return None
        raw = [int(a) for a in value.reshape(-1)]
    else:
        raw = attr(node, "axes")
        if raw is None:
            return None
        raw = [int(a) for a in raw]
    if not raw or attr(node, "noop_with_empty_axes", 0):
        return None
    return sorted(a % len(shape) for a in raw)


def _mean_to_gap(view: GraphView) -> bool:
    import onnx

    for node in view.nodes("ReduceMean"):
        shape = view.shape(node.input[0])
        axes = _axes(view, node)
        if shape is None or axes is None or len(shape) < 3 or axes != list(range(2, len(shape))):
            continue
        keep = int(attr(node, "keepdims", 1))
        out = node.output[0]
        if keep:
            new = [
                onnx.helper.make_node("GlobalAveragePool", [node.input[0]], [out], name=(node.name or "gap") + "_gap")
            ]
        else:
            mid = view.fresh_name(out + "_gap")
            new = [
                onnx.helper.make_node("GlobalAveragePool", [node.input[0]], [mid], name=(node.name or "gap") + "_gap"),
                onnx.helper.make_node("Flatten", [mid], [out], name=(node.name or "gap") + "_flatten", axis=1),
            ]
        for item in new:
            view.replace_output_producer(node, item)
        view.remove(node)
        view.refresh()
        return True
    return False


def _merge_reductions(view: GraphView) -> bool:
    import numpy as np
    import onnx

    for first in list(view.graph.node):
        if first.op_type not in _REDUCTIONS or not int(attr(first, "keepdims", 1)):
            continue
        second = view.only_consumer(first.output[0])
        if second is None or second.op_type != first.op_type or second.input[0] != first.output[0]:
            continue
        a1, a2 = _axes(view, first), _axes(view, second)
        if a1 is None or a2 is None or set(a1) & set(a2):
            continue
        axes = sorted(set(a1) | set(a2))
        keep = int(attr(second, "keepdims", 1))
        new_style = (first.op_type == "ReduceSum" and view.opset >= 13) or view.opset >= 18
        if new_style:
            axes_name = view.add_initializer("axes", np.array(axes, dtype=np.int64))
            node = onnx.helper.make_node(
                first.op_type,
                [first.input[0], axes_name],
                [second.output[0]],
                name=(first.name or "reduce") + "_merged",
                keepdims=keep,
            )
        else:
            node = onnx.helper.make_node(
                first.op_type,
                [first.input[0]],
                [second.output[0]],
                name=(first.name or "reduce") + "_merged",
                keepdims=keep,
                axes=axes,
            )
        view.replace_output_producer(first, node)
        view.remove(first, second)
        view.refresh()
        return True
    return False


def _pad_avgpool(view: GraphView) -> bool:
    import numpy as np

    for pad in view.nodes("Pad"):
        pool = view.only_consumer(pad.output[0])
        if pool is None or pool.op_type != "AveragePool" or view.opset < 11:
            continue
        if attr(pad, "mode", b"constant") not in (b"constant", "constant") or len(pad.input) > 3:
            continue
        pads_value = view.const(pad.input[1]) if len(pad.input) > 1 else None
        fill = view.const(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
        if pads_value is None or fill is None or np.any(fill != 0):
            continue
        pads_list = [int(p) for p in pads_value.reshape(-1)]
        rank = len(pads_list) // 2
        begin, end = pads_list[:rank], pads_list[rank:]
        if rank < 3 or any(p < 0 for p in pads_list) or begin[:2] != [0, 0] or end[:2] != [0, 0]:
            continue
        spatial = rank - 2
        own = list(attr(pool, "pads", [0] * (2 * spatial)))
        if any(own) and not int(attr(pool, "count_include_pad", 0)):
            continue
        if attr(pool, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        merged = [own[i] + begin[2 + i] for i in range(spatial)]
        merged += [own[spatial + i] + end[2 + i] for i in range(spatial)]
        kernel = list(attr(pool, "kernel_shape", []))
        if any(merged[i] >= kernel[i] or merged[spatial + i] >= kernel[i] for i in range(spatial)):
            continue  # ONNX requires pads smaller than the kernel
        pool.input[0] = pad.input[0]
        set_attr(pool, "pads", merged)
        set_attr(pool, "count_include_pad", 1)
        view.remove(pad)
        view.refresh()
        return True
    return False


@register_pass(
    "reduction",
    category="fusion",
    summary="ReduceMean over space -> GlobalAveragePool, merge stacked reductions, fold Pad into AveragePool",
)
def fuse_reduction(view: GraphView) -> int:
    return apply_until_fixed(view, (_mean_to_gap, _merge_reductions, _pad_avgpool))
