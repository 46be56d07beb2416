"""eta4: GhostNet's Ghost module: half the channels from a primary conv, the rest cheap."""

from __future__ import annotations

import torch
from torch import nn

from hmt.supernet.operators.common import bn, conv


class GhostUnit(nn.Module):
    def __init__(self, dims: int, in_ch: int, out_ch: int, kernel: int, stride: int) -> None:
        super().__init__()
        primary_ch = (out_ch + 1) // 2
        self.cheap_ch = out_ch - primary_ch
        self.primary = nn.Sequential(conv(dims, in_ch, primary_ch, kernel, stride), bn(dims, primary_ch))
        # The cheap branch is depthwise over the first ``cheap_ch`` primary channels.
        self.cheap = nn.Sequential(
            conv(dims, self.cheap_ch, self.cheap_ch, 3, 1, groups=self.cheap_ch), bn(dims, self.cheap_ch)
        )
        self.act = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.primary(x)
        return torch.cat([p, self.cheap(self.act(p[:, : self.cheap_ch]))], dim=1)
