"""The CIFAR ResNet-56 of He et al. (option A shortcuts: stride-2 subsampling and zero
channels, no parameters), laid out like the widely used pretrained weights in
``shared/models/resnet-cifar10`` (keys ``conv1``, ``layerN.M.convK``, ``linear``), so
``load_pretrained`` reads them after stripping DataParallel's ``module.`` prefix."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class ShortcutA(nn.Module):
    def __init__(self, extra_channels: int) -> None:
        super().__init__()
        self.extra = extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = self.extra // 2
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, half, self.extra - half))


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut: nn.Module = ShortcutA(out_ch - in_ch) if stride != 1 or in_ch != out_ch else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, blocks_per_stage: int = 9, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        stages: list[nn.Module] = []
        in_ch = 16
        for out_ch, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = [BasicBlock(in_ch, out_ch, stride)] + [BasicBlock(out_ch, out_ch, 1)
                                                            for _ in range(blocks_per_stage - 1)]
            stages.append(nn.Sequential(*blocks))
            in_ch = out_ch
        self.layer1, self.layer2, self.layer3 = stages
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(num_classes: int = 10) -> nn.Module:
    return CifarResNet(9, num_classes)


def cifar_resnet56(num_classes: int = 10) -> nn.Module:
    """``build`` under the network's name: a supernet elastified from ``FILE:cifar_resnet56`` has
    its variants tagged ``cifar_resnet56-...`` (the shipped supernet's)."""
    return CifarResNet(9, num_classes)


def load_pretrained(net: nn.Module, path: Path) -> None:
    """Weights-only load of a ``{'state_dict': {'module.conv1.weight': ...}}`` checkpoint."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    state = saved.get("state_dict", saved)
    net.load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=True)
