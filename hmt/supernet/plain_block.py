"""The plain (VGG) elastic block: one k x k conv + BN + ReLU and its conv-replacing operators."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from hmt.supernet.blocks import SLIM_FULL, BlockSpec, keep_statistics
from hmt.supernet.operators import (
    FireUnit,
    GhostUnit,
    LowRankUnit,
    conv_bn,
    make_depthwise_separable_unit,
    make_kernel_unit,
)
from hmt.supernet.operators.lowrank import full_rank


class ElasticPlainBlock(nn.Module):
    """VGG block: one k x k conv + BN + ReLU, with the conv-replacing operators."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.spec = spec
        d, k, i, o = spec.dims, spec.kernel, spec.in_channels, spec.out_channels
        self.base = conv_bn(d, i, o, k, spec.stride)
        self.alts = nn.ModuleDict()
        # SLIM_FULL: the trainable copy every variant but the original runs.
        self.alts[SLIM_FULL] = conv_bn(d, i, o, k, spec.stride)
        for choice in spec.choices:
            if choice.startswith("lr"):
                self.alts[choice] = LowRankUnit(
                    d, i, o, k, spec.stride, max(1, round(full_rank(i, o, k, d) * int(choice[2:]) / 100))
                )
            elif choice == "dws":
                self.alts[choice] = make_depthwise_separable_unit(d, i, o, k, spec.stride)
            elif choice == "fire":
                self.alts[choice] = FireUnit(d, i, o, k, spec.stride)
            elif choice == "ghost":
                self.alts[choice] = GhostUnit(d, i, o, k, spec.stride)
            elif choice == "k1":
                self.alts[choice] = make_kernel_unit(d, i, o, 1, spec.stride)

    def original_modules(self) -> list[nn.Module]:
        return [self.base]

    def rank_channels(self) -> None:
        """Plain blocks have no inner channels to rank (their output feeds the next block)."""

    @torch.no_grad()
    def init_alternatives(self) -> None:
        for choice, alt in self.alts.items():
            if choice == SLIM_FULL:
                alt.load_state_dict(self.base.state_dict())
            elif isinstance(alt, LowRankUnit):
                alt.init_from_svd(self.base[0].weight, self.base[1])
            elif choice == "k1":
                start = (self.spec.kernel - 1) // 2
                idx = (slice(None), slice(None)) + (slice(start, start + 1),) * self.spec.dims
                alt[0].weight.copy_(self.base[0].weight[idx])
                alt[1].load_state_dict(self.base[1].state_dict())

    def forward(self, x: torch.Tensor, choice: str) -> torch.Tensor:
        if choice == "skip":
            return x
        unit = self.base if choice == "base" else self.alts[choice]
        return F.relu(unit(x))

    def materialize(self, choice: str) -> nn.Module:
        if choice == "skip":
            return nn.Identity()
        unit = keep_statistics(copy.deepcopy(self.base)) if choice == "base" else copy.deepcopy(self.alts[choice])
        return nn.Sequential(unit, nn.ReLU(inplace=True))
