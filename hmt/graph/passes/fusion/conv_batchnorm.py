"""conv-batchnorm: fold an inference BatchNormalization into the Conv before it.

``BN(conv(x, W) + b) = conv(x, W * s) + (b - mean) * s + beta`` with
``s = gamma / sqrt(var + eps)`` per output channel. Also folds a BatchNormalization that
follows a ConvTranspose (scale on the output-channel axis 1 of its weights).
"""

from __future__ import annotations

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView, attr


@register_pass("conv-batchnorm", category="fusion", summary="fold BatchNormalization into the Conv before it")
def fuse_conv_batchnorm(view: GraphView) -> int:
    import numpy as np
    import onnx

    fired = 0
    changed = True
    while changed:
        changed = False
        for bn in view.nodes("BatchNormalization"):
            if len([o for o in bn.output if o]) != 1 or attr(bn, "training_mode", 0):
                continue
            conv = view.producer.get(bn.input[0])
            if conv is None or conv.op_type not in ("Conv", "ConvTranspose") or conv.domain not in ("", "ai.onnx"):
                continue
            if view.only_consumer(conv.output[0]) is not bn:
                continue
            weight = view.const(conv.input[1])
            bias = view.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
            params = [view.const(name) for name in bn.input[1:5]]
            if weight is None or any(p is None for p in params) or weight.dtype not in (np.float32, np.float64):
                continue
            gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
            eps = float(attr(bn, "epsilon", 1e-5))
            scale = gamma / np.sqrt(var + eps)
            out_channels = weight.shape[0] if conv.op_type == "Conv" else weight.shape[1] * int(attr(conv, "group", 1))
            if scale.shape != (out_channels,):
                continue
            if conv.op_type == "Conv":
                new_weight = weight * scale.reshape(-1, *([1] * (weight.ndim - 1)))
            else:
                group = int(attr(conv, "group", 1))
                per_group = weight.shape[1]
                grouped = weight.reshape(group, weight.shape[0] // group, per_group, *weight.shape[2:])
                factor = scale.reshape(group, 1, per_group, *([1] * (weight.ndim - 2)))
                new_weight = (grouped * factor).reshape(weight.shape)
            base_bias = np.zeros(out_channels) if bias is None else bias.astype(np.float64)
            new_bias = (base_bias - mean) * scale + beta
            w_name = view.add_initializer(conv.input[1], new_weight.astype(weight.dtype))
            b_name = view.add_initializer(conv.name or "conv_bias", new_bias.astype(weight.dtype))
            fused = onnx.helper.make_node(
                conv.op_type,
                [conv.input[0], w_name, b_name],
                [bn.output[0]],
                name=(conv.name or "conv") + "_bn",
            )
            fused.attribute.extend(conv.attribute)
            view.replace_output_producer(conv, fused)
            view.remove(conv, bn)
            view.refresh()
            fired += 1
            changed = True
            break
    return fired
