"""channel-wise: fold per-channel affine ops and pointwise convolutions into convolutions.

- ``Conv`` then ``Mul`` by a per-output-channel (or scalar) constant -> scaled weights;
- ``Conv`` then ``Add`` of a per-output-channel (or scalar) constant -> bias;
- a ``Conv`` (group 1) then a pointwise 1x1 ``Conv`` (group 1, stride 1, no padding)
  with nothing between -> one ``Conv`` (``W = W2 @ W1``), when that does not add MACs;
- a zero constant ``Pad`` on the spatial axes only -> the ``Conv``'s own ``pads``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView, apply_until_fixed, attr, set_attr

if TYPE_CHECKING:
    import numpy as np
    import onnx


def _conv_parts(view: GraphView, conv: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    import numpy as np

    weight = view.const(conv.input[1])
    if weight is None or weight.dtype not in (np.float32, np.float64):
        return None
    if len(conv.input) > 2 and conv.input[2]:
        bias = view.const(conv.input[2])
        if bias is None:
            return None
    else:
        bias = np.zeros(weight.shape[0], dtype=weight.dtype)
    return weight, bias


def _per_channel(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """The constant as a [channels] vector if it broadcasts along axis 1 only, else None."""
    import numpy as np

    if not np.issubdtype(value.dtype, np.floating):
        return None
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]))
    shape = value.shape
    if value.size != channels or len(shape) > rank:
        return None
    padded = (1,) * (rank - len(shape)) + tuple(shape)
    if padded[1] != channels or any(d != 1 for i, d in enumerate(padded) if i != 1):
        return None
    return value.reshape(-1).astype(np.float64)


def _replace_conv(
    view: GraphView,
    conv: onnx.NodeProto,
    tail: onnx.NodeProto,
    weight: np.ndarray,
    bias: np.ndarray,
    *,
    x: str | None = None,
    suffix: str,
) -> None:
    import onnx

    w_name = view.add_initializer(conv.input[1], weight)
    b_name = view.add_initializer((conv.name or "conv") + "_b", bias)
    fused = onnx.helper.make_node(
        "Conv", [x or conv.input[0], w_name, b_name], [tail.output[0]], name=(conv.name or "conv") + suffix
    )
    fused.attribute.extend(conv.attribute)
    view.replace_output_producer(conv, fused)


def _conv_affine(view: GraphView) -> bool:
    for conv in view.nodes("Conv"):
        tail = view.only_consumer(conv.output[0])
        if tail is None or tail.op_type not in ("Mul", "Add") or tail.domain not in ("", "ai.onnx"):
            continue
        parts = _conv_parts(view, conv)
        if parts is None:
            continue
        weight, bias = parts
        other = tail.input[1] if tail.input[0] == conv.output[0] else tail.input[0]
        constant = view.const(other)
        if constant is None:
            continue
        vector = _per_channel(constant, weight.shape[0], weight.ndim)
        if vector is None:
            continue
        if tail.op_type == "Mul":
            new_w = weight * vector.reshape(-1, *([1] * (weight.ndim - 1)))
            new_b = bias * vector
        else:
            new_w, new_b = weight, bias + vector
        _replace_conv(view, conv, tail, new_w.astype(weight.dtype), new_b.astype(weight.dtype), suffix="_cw")
        view.remove(conv, tail)
        view.refresh()
        return True
    return False


def _is_pointwise(view: GraphView, conv: onnx.NodeProto) -> bool:
    weight = view.const(conv.input[1])
    return (
        weight is not None
        and all(k == 1 for k in weight.shape[2:])
        and int(attr(conv, "group", 1)) == 1
        and all(s == 1 for s in attr(conv, "strides", [1]))
        and all(p == 0 for p in attr(conv, "pads", [0]))
        and attr(conv, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET", b"VALID", "VALID")
    )


def _conv_pointwise(view: GraphView) -> bool:
    import numpy as np

    for first in view.nodes("Conv"):
        second = view.only_consumer(first.output[0])
        if second is None or second.op_type != "Conv" or second.input[0] != first.output[0]:
            continue
        if int(attr(first, "group", 1)) != 1 or not _is_pointwise(view, second):
            continue
        p1, p2 = _conv_parts(view, first), _conv_parts(view, second)
        if p1 is None or p2 is None:
            continue
        (w1, b1), (w2, b2) = p1, p2
        kernel = int(np.prod(w1.shape[2:]))
        if w2.shape[0] * w1.shape[1] * kernel > w1.size + w2.shape[0] * w2.shape[1]:
            continue
        m2 = w2.reshape(w2.shape[0], w2.shape[1]).astype(np.float64)
        merged = np.tensordot(m2, w1.astype(np.float64), axes=([1], [0]))
        _replace_conv(view, first, second, merged.astype(w1.dtype), (m2 @ b1 + b2).astype(w1.dtype), suffix="_pw")
        view.remove(first, second)
        view.refresh()
        return True
    return False


def _pad_conv(view: GraphView) -> bool:
    import numpy as np

    for pad in view.nodes("Pad"):
        conv = view.only_consumer(pad.output[0])
        if conv is None or conv.op_type != "Conv" or conv.input[0] != pad.output[0]:
            continue
        mode = attr(pad, "mode", b"constant")
        if mode not in (b"constant", "constant"):
            continue
        if view.opset >= 11:
            pads_value = view.const(pad.input[1]) if len(pad.input) > 1 else None
            fill = view.const(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
            if len(pad.input) > 3 and pad.input[3]:
                continue  # explicit axes: keep it simple
        else:
            raw = attr(pad, "pads")
            pads_value = np.array(raw) if raw is not None else None
            fill = np.array([attr(pad, "value", 0.0)])
        if (
            pads_value is None
            or fill is None
            or np.any(fill != 0)
            or attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
        ):
            continue
        pads_list = [int(p) for p in pads_value.reshape(-1)]
        rank = len(pads_list) // 2
        begin, end = pads_list[:rank], pads_list[rank:]
        if rank < 3 or any(p < 0 for p in pads_list) or begin[:2] != [0, 0] or end[:2] != [0, 0]:
            continue
        conv_pads = list(attr(conv, "pads", [0] * (2 * (rank - 2))))
        spatial = rank - 2
        merged = [conv_pads[i] + begin[2 + i] for i in range(spatial)] + [
            conv_pads[spatial + i] + end[2 + i] for i in range(spatial)
        ]
        conv.input[0] = pad.input[0]
        set_attr(conv, "pads", merged)
        view.remove(pad)
        view.refresh()
        return True
    return False


@register_pass(
    "channel-wise",
    category="fusion",
    summary="fold per-channel Mul/Add, pointwise 1x1 conv chains and zero Pad into Conv",
)
def fuse_channelwise(view: GraphView) -> int:
    return apply_until_fixed(view, (_pad_conv, _conv_affine, _conv_pointwise))
