"""Dimension-generic conv/BN builders (2-D for images, 1-D for sensor and audio windows)."""

from __future__ import annotations

from torch import nn


def conv(
    dims: int, in_ch: int, out_ch: int, kernel: int, stride: int = 1, groups: int = 1, bias: bool = False
) -> nn.Module:
    cls = nn.Conv2d if dims == 2 else nn.Conv1d
    return cls(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=bias)


def bn(dims: int, channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm1d(channels)


def conv_bn(dims: int, in_ch: int, out_ch: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(conv(dims, in_ch, out_ch, kernel, stride, groups), bn(dims, out_ch))
