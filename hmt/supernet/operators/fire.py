"""eta2: SqueezeNet's Fire module as a drop-in conv unit."""

from __future__ import annotations

import torch
from torch import nn

from hmt.supernet.operators.common import bn, conv


class FireUnit(nn.Module):
    """Squeeze 1x1 (with the stride) -> expand 1x1 and k x k in parallel, concatenated, BN."""

    def __init__(self, dims: int, in_ch: int, out_ch: int, kernel: int, stride: int) -> None:
        super().__init__()
        squeeze_ch = max(4, out_ch // 4)
        half = out_ch // 2
        self.squeeze = nn.Sequential(
            conv(dims, in_ch, squeeze_ch, 1, stride), bn(dims, squeeze_ch), nn.ReLU(inplace=True)
        )
        self.expand1 = conv(dims, squeeze_ch, half, 1)
        self.expandk = conv(dims, squeeze_ch, out_ch - half, kernel)
        self.norm = bn(dims, out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return self.norm(torch.cat([self.expand1(s), self.expandk(s)], dim=1))
