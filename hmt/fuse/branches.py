"""How many compute operators of a graph could run at once: whether ORT's parallel mode can help.

ORT's parallel executor hands independent nodes to inter-op threads; every hand-off costs
a thread wake-up, which on a busy 2-core machine measured ~100 ms per ResNet-20 inference
against 0.5 ms sequential (benchmarks/precision/results/parallel_operators.json). It can only pay off where the
graph has parallel branches of real work, so fuse offers the candidate only there.

The width is taken level by level (ASAP schedule: a node's level is one more than its
deepest producer's): the most heavy operators (convolutions, matrix products) on one
level. A residual block whose shortcut is an identity or a pad has width 1; a Fire
module's 1x1 and 3x3 expands, or an Inception block, have width 2 or more.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul", "ConvInteger",
                       "MatMulInteger", "LSTM", "GRU", "RNN"})


def parallel_width(model: onnx.ModelProto) -> int:
    """The largest number of heavy operators on one level of ``model``'s ASAP schedule (0: none)."""
    level: dict[str, int] = {}
    counts: Counter[int] = Counter()
    for node in model.graph.node:  # ONNX graphs are topologically sorted (checker-enforced)
        depth = 1 + max((level.get(name, 0) for name in node.input if name), default=0)
        for output in node.output:
            level[output] = depth
        if node.op_type in HEAVY_OPS:
            counts[depth] += 1
    return max(counts.values(), default=0)


__all__ = ["HEAVY_OPS", "parallel_width"]
