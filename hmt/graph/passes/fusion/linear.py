"""linear: merge matrix products with the affine ops around them.

- ``MatMul(x, W) + b`` with a rank-2 ``x`` and a constant ``W`` -> ``Gemm``;
- ``Gemm`` followed by an inference ``BatchNormalization`` (BN1d) -> one ``Gemm``;
- two ``Gemm`` with constant weights and nothing non-linear between -> one ``Gemm``
  (``W2 (W1 x + b1) + b2``), only when the merged weight is not larger than the pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hmt.graph.passes.registry import register_pass
from hmt.graph.rewrite import GraphView, apply_until_fixed, attr

if TYPE_CHECKING:
    import numpy as np
    import onnx


def _gemm_parts(view: GraphView, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """A Gemm's effective (W[out, in], b[out]) with alpha/beta/transB applied, or None."""
    import numpy as np

    if attr(node, "transA", 0):
        return None
    weight = view.const(node.input[1])
    if weight is None or weight.ndim != 2 or weight.dtype not in (np.float32, np.float64):
        return None
    w = weight.astype(np.float64) * float(attr(node, "alpha", 1.0))
    w = w if attr(node, "transB", 0) else w.T  # -> [out, in]
    if len(node.input) > 2 and node.input[2]:
        bias = view.const(node.input[2])
        if bias is None:
            return None
        b = np.broadcast_to(bias.astype(np.float64) * float(attr(node, "beta", 1.0)), (w.shape[0],)).copy()
        if bias.ndim == 2 and bias.shape[0] != 1:
            return None
    else:
        b = np.zeros(w.shape[0])
    return w, b


def _emit_gemm(
    view: GraphView, x: str, w: np.ndarray, b: np.ndarray, out: str, *, like: onnx.NodeProto, dtype: np.dtype, name: str
) -> onnx.NodeProto:
    import onnx

    w_name = view.add_initializer(name + "_W", w.astype(dtype))
    b_name = view.add_initializer(name + "_b", b.astype(dtype))
    node = onnx.helper.make_node("Gemm", [x, w_name, b_name], [out], name=name, transB=1)
    view.replace_output_producer(like, node)
    return node


def _matmul_add(view: GraphView) -> bool:
    import numpy as np

    for matmul in view.nodes("MatMul"):
        weight = view.const(matmul.input[1])
        shape = view.shape(matmul.input[0])
        if weight is None or weight.ndim != 2 or shape is None or len(shape) != 2:
            continue
        add = view.only_consumer(matmul.output[0])
        if add is None or add.op_type != "Add":
            continue
        other = add.input[1] if add.input[0] == matmul.output[0] else add.input[0]
        bias = view.const(other)
        if bias is None or bias.size != weight.shape[1] or bias.ndim > 2 or not np.issubdtype(bias.dtype, np.floating):
            continue
        _emit_gemm(
            view,
            matmul.input[0],
            weight.T.astype(np.float64),
            bias.reshape(-1).astype(np.float64),
            add.output[0],
            like=matmul,
            dtype=weight.dtype,
            name=(matmul.name or "matmul") + "_gemm",
        )
        view.remove(matmul, add)
        view.refresh()
        return True
    return False


def _gemm_batchnorm(view: GraphView) -> bool:
    import numpy as np

    for gemm in view.nodes("Gemm"):
        bn = view.only_consumer(gemm.output[0])
        if bn is None or bn.op_type != "BatchNormalization" or len([o for o in bn.output if o]) != 1:
            continue
        parts = _gemm_parts(view, gemm)
        params = [view.const(name) for name in bn.input[1:5]]
        if parts is None or any(p is None for p in params):
            continue
        w, b = parts
        gamma, beta, mean, var = (np.asarray(p, dtype=np.float64) for p in params)
        scale = gamma / np.sqrt(var + float(attr(bn, "epsilon", 1e-5)))
        if scale.shape != (w.shape[0],):
            continue
        dtype = view.const(gemm.input[1]).dtype  # type: ignore[union-attr]
        _emit_gemm(
            view,
            gemm.input[0],
            w * scale[:, None],
            (b - mean) * scale + beta,
            bn.output[0],
            like=gemm,
            dtype=dtype,
            name=(gemm.name or "gemm") + "_bn",
        )
        view.remove(gemm, bn)
        view.refresh()
        return True
    return False


def _gemm_gemm(view: GraphView) -> bool:
    for first in view.nodes("Gemm"):
        second = view.only_consumer(first.output[0])
        if second is None or second.op_type != "Gemm" or second.input[0] != first.output[0]:
            continue
        p1, p2 = _gemm_parts(view, first), _gemm_parts(view, second)
        if p1 is None or p2 is None:
            continue
        (w1, b1), (w2, b2) = p1, p2
        if w2.shape[0] * w1.shape[1] > w1.size + w2.size:
            continue  # merging would add MACs (a bottleneck pair); keep it
        dtype = view.const(first.input[1]).dtype  # type: ignore[union-attr]
        _emit_gemm(
            view,
            first.input[0],
            w2 @ w1,
            w2 @ b1 + b2,
            second.output[0],
            like=first,
            dtype=dtype,
            name=(first.name or "gemm") + "_merged",
        )
        view.remove(first, second)
        view.refresh()
        return True
    return False


@register_pass("linear", category="fusion", summary="MatMul+Add -> Gemm, Gemm+BatchNorm and Gemm+Gemm merges")
def fuse_linear(view: GraphView) -> int:
    return apply_until_fixed(view, (_matmul_add, _gemm_batchnorm, _gemm_gemm))
