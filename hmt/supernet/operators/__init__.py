"""Compression operators (CrowdHMTware eta1-eta6), one module per operator family.

Each ``make_*_unit`` returns a module mapping ``in_channels`` to ``out_channels`` with
the given kernel and stride, ending in batch norm and no activation, so any of them can
stand in for a conv+BN unit of a block.
"""

from hmt.supernet.operators.common import bn, conv, conv_bn
from hmt.supernet.operators.compound import make_kernel_unit
from hmt.supernet.operators.fire import FireUnit
from hmt.supernet.operators.ghost import GhostUnit
from hmt.supernet.operators.lowrank import LowRankUnit, make_depthwise_separable_unit

__all__ = [
    "FireUnit",
    "GhostUnit",
    "LowRankUnit",
    "bn",
    "conv",
    "conv_bn",
    "make_depthwise_separable_unit",
    "make_kernel_unit",
]
