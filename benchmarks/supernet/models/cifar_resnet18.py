"""A standard CIFAR ResNet-18 as a user brings it: 3x3 stem, BasicBlocks [2, 2, 2, 2],
widths 64-512, global average pool, one linear layer. ``build()`` returns it untrained;
``train-supernet --model benchmarks/supernet/models/cifar_resnet18.py:build --weights W``
elastifies it with the weights ``python -m benchmarks.supernet.originals`` wrote.

The twins of its elastified variants (the same network trained alone): ``build_w50`` is the
variant with every stream and inner width at 0.5 (``e3.555555555555``), ``build_w50x25`` the one
with the stream at 0.5 and each block's inner width at 0.25 (``e3.522522522522``)."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int, inner_ch: int | None = None) -> None:
        super().__init__()
        inner_ch = inner_ch or out_ch
        self.conv1 = nn.Conv2d(in_ch, inner_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner_ch)
        self.conv2 = nn.Conv2d(inner_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CifarResNet18(nn.Module):
    def __init__(self, num_classes: int = 10, stream_width: float = 1.0, inner_width: float = 1.0) -> None:
        super().__init__()
        stem_ch = round(64 * stream_width)
        self.conv1 = nn.Conv2d(3, stem_ch, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_ch)
        layers: list[nn.Module] = []
        in_ch = stem_ch
        for base_ch, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            out_ch, inner_ch = round(base_ch * stream_width), round(base_ch * inner_width)
            layers.append(nn.Sequential(BasicBlock(in_ch, out_ch, stride, inner_ch),
                                        BasicBlock(out_ch, out_ch, 1, inner_ch)))
            in_ch = out_ch
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def build(num_classes: int = 10) -> nn.Module:
    return CifarResNet18(num_classes)


def build_w50(num_classes: int = 10) -> nn.Module:
    return CifarResNet18(num_classes, stream_width=0.5, inner_width=0.5)


def build_w50x25(num_classes: int = 10) -> nn.Module:
    return CifarResNet18(num_classes, stream_width=0.5, inner_width=0.25)
