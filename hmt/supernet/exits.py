"""Early-exit heads (AdaScale III-A2) and the backbone's own classifier head."""

from __future__ import annotations

import torch
from torch import nn

from hmt.supernet.operators import bn, conv


def to_channels_first(x: torch.Tensor) -> torch.Tensor:
    """(N, ..., C) -> (N, C, ...) by an explicit permutation (ONNX export of movedim(-1, 1) wrote an
    invalid Transpose)."""
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))


class ExitHead(nn.Module):
    """conv 3x3 stride 2 -> BN -> ReLU -> adaptive average pool to 1 -> dropout -> linear.

    ``channels_last``: the features arrive as (N, H, W, C) or (N, L, C), as a transformer's
    stages hand them on; the channel axis is moved to 1 first.
    """

    def __init__(
        self, dims: int, in_ch: int, num_classes: int, *, hidden: int | None = None, dropout: float = 0.2,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.channels_last = channels_last
        hidden = hidden or min(2 * in_ch, 256)
        self.features = nn.Sequential(conv(dims, in_ch, hidden, 3, 2), bn(dims, hidden), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1) if dims == 2 else nn.AdaptiveAvgPool1d(1)
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = to_channels_first(x)
        return self.linear(self.dropout(torch.flatten(self.pool(self.features(x)), 1)))


class ClassifierHead(nn.Module):
    """The backbone's final head: optional feature layers, pool, linear (the last exit)."""

    def __init__(
        self,
        dims: int,
        in_ch: int,
        num_classes: int,
        *,
        pre: nn.Module | None = None,
        pre_channels: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.pre = pre if pre is not None else nn.Identity()
        self.pool = nn.AdaptiveAvgPool2d(1) if dims == 2 else nn.AdaptiveAvgPool1d(1)
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(pre_channels or in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(torch.flatten(self.pool(self.pre(x)), 1)))
