"""Slicing the stream (stage output channels) of a supernet: the functional forms used
while training and the plain modules a materialised variant gets.

A slim stream keeps the first ``c`` channels of every tensor of a stage (no re-ordering:
the slim copies start as exact copies of the original, and an early exit head serves the
full and the slim streams alike, so channel ``i`` must mean the same thing in both).
BN layers are shared across stream widths and sliced; every variant re-estimates its
statistics at materialisation (``hmt.supernet.calibrate``), as Once-for-All does.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

_CONVS = (nn.Conv1d, nn.Conv2d)


def sliced_bn(norm: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm`` applied to the first ``x.shape[1]`` channels."""
    c = x.shape[1]
    if c == norm.num_features:
        return norm(x)
    assert norm.running_mean is not None and norm.running_var is not None
    momentum = 0.0 if norm.momentum is None else norm.momentum
    return F.batch_norm(
        x,
        norm.running_mean[:c],
        norm.running_var[:c],
        norm.weight[:c] if norm.weight is not None else None,
        norm.bias[:c] if norm.bias is not None else None,
        norm.training,
        momentum,
        norm.eps,
    )


def slice_bn(norm: _BatchNorm, channels: int) -> _BatchNorm:
    """A plain BN of ``channels`` features: the first ones of ``norm``."""
    out = type(norm)(channels, eps=norm.eps, momentum=norm.momentum)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            src = getattr(norm, name)
            if src is not None:
                getattr(out, name).copy_(src[:channels])
    return out.to(norm.weight.device if norm.weight is not None else "cpu")


def slice_conv(layer: nn.Module, *, out_channels: int | None = None, in_channels: int | None = None) -> nn.Module:
    """A plain conv with the first ``out_channels`` filters over the first ``in_channels`` inputs."""
    assert isinstance(layer, _CONVS) and layer.groups == 1
    o = out_channels or layer.out_channels
    i = in_channels or layer.in_channels
    out = type(layer)(i, o, layer.kernel_size, layer.stride, layer.padding, bias=layer.bias is not None)
    with torch.no_grad():
        out.weight.copy_(layer.weight[:o, :i])
        if layer.bias is not None and out.bias is not None:
            out.bias.copy_(layer.bias[:o])
    return out.to(layer.weight.device)


def conv_forward(layer: nn.Module, x: torch.Tensor, out_channels: int) -> torch.Tensor:
    """``layer`` (a plain conv) over ``x``'s channels, producing ``out_channels``."""
    fn = F.conv2d if isinstance(layer, nn.Conv2d) else F.conv1d
    bias = layer.bias[:out_channels] if layer.bias is not None else None
    return fn(x, layer.weight[:out_channels, : x.shape[1]], bias, layer.stride, layer.padding)


def seq_forward(seq: nn.Sequential, x: torch.Tensor, out_channels: int) -> torch.Tensor:
    """A conv-BN-activation stem with its output sliced to ``out_channels``."""
    for layer in seq:
        if isinstance(layer, _CONVS):
            x = conv_forward(layer, x, out_channels)
        elif isinstance(layer, _BatchNorm):
            x = sliced_bn(layer, x)
        else:
            x = layer(x)
    return x


def slice_seq(seq: nn.Sequential, out_channels: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for layer in seq:
        if isinstance(layer, _CONVS):
            layers.append(slice_conv(layer, out_channels=out_channels))
        elif isinstance(layer, _BatchNorm):
            layers.append(slice_bn(layer, out_channels))
        else:
            layers.append(copy.deepcopy(layer))
    return nn.Sequential(*layers)


def head_forward(head: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An exit head (ExitHead or ClassifierHead) reading the first ``x.shape[1]`` channels."""
    c = x.shape[1]
    if hasattr(head, "features"):  # ExitHead: conv -> BN -> ReLU -> pool -> dropout -> linear
        conv, norm, act = list(head.features)
        fn = F.conv2d if isinstance(conv, nn.Conv2d) else F.conv1d
        h = act(norm(fn(x, conv.weight[:, :c], None, conv.stride, conv.padding)))
        return head.linear(head.dropout(torch.flatten(head.pool(h), 1)))
    # ClassifierHead with no feature layers: pool -> dropout -> linear over the first c inputs
    h = head.dropout(torch.flatten(head.pool(x), 1))
    return F.linear(h, head.linear.weight[:, :c], head.linear.bias)


def slice_head(head: nn.Module, in_channels: int) -> nn.Module:
    out = copy.deepcopy(head)
    with torch.no_grad():
        if hasattr(out, "features"):
            features: Any = out.features
            features[0] = slice_conv(head.features[0], in_channels=in_channels)
        else:
            linear = nn.Linear(in_channels, head.linear.out_features).to(head.linear.weight.device)
            linear.weight.copy_(head.linear.weight[:, :in_channels])
            linear.bias.copy_(head.linear.bias)
            out.linear = linear
    return out


class StreamWidthSlot(nn.Module):
    """Placeholder at a stream-width position, so ``blocks[p]`` lines up with
    ``space.positions[p]``: it runs and holds nothing (the supernet applies the width)."""

    def forward(self, x: torch.Tensor, choice: str, out_channels: int | None = None) -> torch.Tensor:
        return x

    def materialize(self, choice: str, in_channels: int | None = None, out_channels: int | None = None) -> nn.Module:
        return nn.Identity()

    def original_modules(self) -> list[nn.Module]:
        return []

    def rank_channels(self) -> None:
        """Nothing to rank."""

    def init_alternatives(self) -> None:
        """Nothing to initialise."""
