"""The elastic block of each ``BlockSpec.kind``, as the backbones name them."""

from __future__ import annotations

from torch import nn

from hmt.supernet.blocks import ElasticBasicBlock, ElasticInvertedResidual
from hmt.supernet.plain_block import ElasticPlainBlock

BLOCK_TYPES: dict[str, type[nn.Module]] = {
    "basic": ElasticBasicBlock,
    "inverted": ElasticInvertedResidual,
    "plain": ElasticPlainBlock,
}
