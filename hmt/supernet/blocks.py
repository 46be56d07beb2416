"""Elastic blocks: one block position holding its original path and every alternative.

``forward(x, choice)`` runs one choice; ``materialize(choice)`` returns a plain module with
only that choice's weights, whose output equals ``forward(x, choice)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hmt.supernet.operators import (
    FireUnit,
    GhostUnit,
    LowRankUnit,
    bn,
    conv,
    conv_bn,
    make_depthwise_separable_unit,
    make_kernel_unit,
)
from hmt.supernet.operators.lowrank import full_rank
from hmt.supernet.slim import conv_forward, slice_bn, slice_conv, sliced_bn
from hmt.supernet.space import WIDTH_RATIOS


@dataclass(frozen=True)
class BlockSpec:
    kind: str  # "basic" | "inverted" | "plain"
    in_channels: int
    out_channels: int
    mid_channels: int
    stride: int
    kernel: int
    dims: int
    shortcut: str  # "identity" | "option_a" | "projection" | "none"
    choices: tuple[str, ...]
    stream_elastic: bool = False  # input/output channels may be slimmed (stage widths)


# The slim copy at full inner width: what a block runs on a slimmed stream with "base".
SLIM_FULL = "full"


def width_channels(channels: int, choice: str) -> int:
    return channels if choice == SLIM_FULL else max(1, round(channels * WIDTH_RATIOS[choice]))


# BN layers of the user's original network carry this mark in a materialised variant:
# per-variant re-estimation (hmt.supernet.calibrate) leaves their statistics as trained,
# because training ran them with exactly those statistics (the original is frozen).
KEEP_STATISTICS = "hmt_keep_statistics"


def keep_statistics(module: nn.Module) -> nn.Module:
    """Mark every BN inside ``module`` as the original's (statistics never re-estimated)."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            setattr(m, KEEP_STATISTICS, True)
    return module


def _keep_if(condition: bool, module: nn.Module) -> nn.Module:
    return keep_statistics(module) if condition else module


class OptionAShortcut(nn.Module):
    """He et al.'s CIFAR shortcut: subsample and zero-pad the new channels (no weights)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, dims: int) -> None:
        super().__init__()
        self.stride = stride
        self.dims = dims
        extra = out_ch - in_ch
        self.out_ch = out_ch
        # A slim stream can hand this block more channels than it writes: keep the first.
        self.pad_front = max(0, extra) // 2
        self.pad_back = max(0, extra) - max(0, extra) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride] if self.dims == 2 else x[:, :, :: self.stride]
        if x.shape[1] > self.out_ch:
            return x[:, : self.out_ch]
        spatial = (0, 0) * self.dims
        return F.pad(x, (*spatial, self.pad_front, self.pad_back))


def make_shortcut(spec: BlockSpec) -> nn.Module:
    if spec.shortcut == "identity":
        return nn.Identity()
    if spec.shortcut == "option_a":
        return OptionAShortcut(spec.in_channels, spec.out_channels, spec.stride, spec.dims)
    if spec.shortcut == "projection":
        return conv_bn(spec.dims, spec.in_channels, spec.out_channels, 1, spec.stride)
    raise ValueError(f"unknown shortcut {spec.shortcut!r}")


class Residual(nn.Module):
    """A materialised residual block: act(path(x) + shortcut(x))."""

    def __init__(self, path: nn.Module, shortcut: nn.Module | None, act: nn.Module) -> None:
        super().__init__()
        self.path = path
        self.shortcut = shortcut
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.path(x)
        if self.shortcut is not None:
            out = out + self.shortcut(x)
        return self.act(out)


def _conv_fn(dims: int):  # type: ignore[no-untyped-def]
    return F.conv2d if dims == 2 else F.conv1d


def _copy_conv(dims: int, weight: torch.Tensor, stride: int, kernel: int) -> nn.Module:
    layer = conv(dims, weight.shape[1], weight.shape[0], kernel, stride)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def _pair_unit(make: object, spec: BlockSpec) -> nn.Sequential:
    """Two units in sequence (in -> mid with the stride, mid -> out), ReLU between."""
    first = make(spec.in_channels, spec.mid_channels, spec.stride)
    second = make(spec.mid_channels, spec.out_channels, 1)
    return nn.Sequential(first, nn.ReLU(inplace=True), second)


class ElasticBasicBlock(nn.Module):
    """ResNet basic block (two k x k convs) with every compression operator as an option.

    The original convs, BNs and shortcut run only for ``base`` on the full stream. The
    slim widths, and any choice on a slimmed stream (``spec.stream_elastic``), run a
    trainable copy ("slim copy") sliced to the inner width and to the stream's channels.
    """

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.spec = spec
        d, k = spec.dims, spec.kernel
        self.conv1 = conv(d, spec.in_channels, spec.mid_channels, k, spec.stride)
        self.conv2 = conv(d, spec.mid_channels, spec.out_channels, k, 1)
        widths = [c for c in spec.choices if c in WIDTH_RATIOS]
        # Width options keep private BN statistics (switchable BN); SLIM_FULL is the slim
        # copy at full inner width, used on slimmed streams.
        slim_keys = [*widths, SLIM_FULL]
        self.bn1 = nn.ModuleDict({c: bn(d, width_channels(spec.mid_channels, c)) for c in slim_keys})
        self.bn2 = nn.ModuleDict({c: bn(d, spec.out_channels) for c in slim_keys})
        # The slim widths share one trainable copy of the convs (importance-sorted at
        # prepare time), so training them never touches the original's weights: the
        # largest variant stays the user's network, bit for bit (AdaptiveNet).
        self.conv1w = conv(d, spec.in_channels, spec.mid_channels, k, spec.stride)
        self.conv2w = conv(d, spec.mid_channels, spec.out_channels, k, 1)
        self.alts = nn.ModuleDict()
        for choice in spec.choices:
            alt = self._make_alt(choice)
            if alt is not None:
                self.alts[choice] = alt
        self.shortcut = make_shortcut(spec)
        self.shortcut_w = (
            conv_bn(d, spec.in_channels, spec.out_channels, 1, spec.stride) if spec.shortcut == "projection" else None
        )

    def _make_alt(self, choice: str) -> nn.Module | None:
        spec, d, k = self.spec, self.spec.dims, self.spec.kernel
        if choice.startswith("lr"):
            fraction = int(choice[2:]) / 100

            def make_lr(i: int, o: int, s: int) -> nn.Module:
                return LowRankUnit(d, i, o, k, s, max(1, round(full_rank(i, o, k, d) * fraction)))

            return _pair_unit(make_lr, spec)
        if choice == "dws":
            return _pair_unit(lambda i, o, s: make_depthwise_separable_unit(d, i, o, k, s), spec)
        if choice == "fire":
            return _pair_unit(lambda i, o, s: FireUnit(d, i, o, k, s), spec)
        if choice == "ghost":
            return _pair_unit(lambda i, o, s: GhostUnit(d, i, o, k, s), spec)
        if choice == "k1":
            return _pair_unit(lambda i, o, s: make_kernel_unit(d, i, o, 1, s), spec)
        if choice == "merge":
            return _pair_unit(lambda i, o, s: conv_bn(d, i, o, k, s), spec)
        return None  # base, widths, skip

    def original_modules(self) -> list[nn.Module]:
        """The modules of the user's block (what the largest variant runs)."""
        return [self.conv1, self.conv2, self.bn1["base"], self.bn2["base"], self.shortcut]

    def rank_channels(self) -> None:
        """eta6 ranking happens in ``init_alternatives``, on the slim copy: the original's
        channel order is never changed."""

    @torch.no_grad()
    def init_alternatives(self) -> None:
        """Start every alternative from the original weights where the operator allows;
        the slim widths from a copy whose inner channels are ordered by importance
        (|gamma| x L1 of the filter), so every width keeps the most important ones."""
        base_bn1, base_bn2 = self.bn1["base"], self.bn2["base"]
        order = torch.argsort(self.conv1.weight.abs().flatten(1).sum(1) * base_bn1.weight.abs(), descending=True)
        if self.conv1w is not None and self.conv2w is not None:
            self.conv1w.weight.copy_(self.conv1.weight[order])
            self.conv2w.weight.copy_(self.conv2.weight[:, order])
        for choice, norm in self.bn1.items():
            if choice == "base":
                continue
            m = width_channels(self.spec.mid_channels, choice)
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(norm, name).copy_(getattr(base_bn1, name)[order][:m])
            self.bn2[choice].load_state_dict(base_bn2.state_dict())
        if self.shortcut_w is not None:
            self.shortcut_w.load_state_dict(self.shortcut.state_dict())
        for choice, alt in self.alts.items():
            first, second = alt[0], alt[2]
            if isinstance(first, LowRankUnit):
                first.init_from_svd(self.conv1.weight, base_bn1)
                second.init_from_svd(self.conv2.weight, base_bn2)
            elif choice == "merge" or choice == "k1":
                source_kernel = self.spec.kernel
                for unit, weight, norm in ((first, self.conv1.weight, base_bn1), (second, self.conv2.weight, base_bn2)):
                    if choice == "merge":
                        unit[0].weight.copy_(weight)
                    else:
                        start = (source_kernel - 1) // 2
                        idx = (slice(None), slice(None)) + (slice(start, start + 1),) * self.spec.dims
                        unit[0].weight.copy_(weight[idx])
                    unit[1].load_state_dict(norm.state_dict())

    # -- running -----------------------------------------------------------------------

    def _slim_key(self, choice: str, in_channels: int, out_channels: int) -> str | None:
        """The BN key of the slim copy ``choice`` runs, or None for the original/an operator."""
        full = in_channels == self.spec.in_channels and out_channels == self.spec.out_channels
        if choice == "base":
            return None if full else SLIM_FULL
        if choice == SLIM_FULL:
            return SLIM_FULL
        if choice in self.bn1:
            return choice
        if not full:
            raise ValueError(f"block {self.spec}: {choice!r} cannot run on a slimmed stream")
        return None

    def _path(self, x: torch.Tensor, key: str, out_channels: int) -> torch.Tensor:
        original = key == "base"
        conv1 = self.conv1 if original else self.conv1w
        conv2 = self.conv2 if original else self.conv2w
        assert conv1 is not None and conv2 is not None
        m = width_channels(self.spec.mid_channels, key)
        fn = _conv_fn(self.spec.dims)
        pad = self.spec.kernel // 2
        h = fn(x, conv1.weight[:m, : x.shape[1]], None, self.spec.stride, pad)
        h = F.relu(self.bn1[key](h))
        h = fn(h, conv2.weight[:out_channels, :m], None, 1, pad)
        return sliced_bn(self.bn2[key], h)

    def _slim_shortcut(self, x: torch.Tensor, out_channels: int) -> torch.Tensor:
        if self.spec.shortcut == "identity":
            return x
        if self.spec.shortcut == "option_a":
            return OptionAShortcut(x.shape[1], out_channels, self.spec.stride, self.spec.dims)(x)
        assert self.shortcut_w is not None
        return sliced_bn(self.shortcut_w[1], conv_forward(self.shortcut_w[0], x, out_channels))

    def forward(self, x: torch.Tensor, choice: str, out_channels: int | None = None) -> torch.Tensor:
        if choice == "skip":
            return x
        out_c = self.spec.out_channels if out_channels is None else out_channels
        key = self._slim_key(choice, x.shape[1], out_c)
        if key is None and choice != "base":
            return F.relu(self.alts[choice](x) + self.shortcut(x))
        path = self._path(x, key or "base", out_c)
        # The original runs its own shortcut; the copy its copy (identity/option A: no weights).
        return F.relu(path + (self.shortcut(x) if key is None else self._slim_shortcut(x, out_c)))

    def materialize(self, choice: str, in_channels: int | None = None, out_channels: int | None = None) -> nn.Module:
        if choice == "skip":
            return nn.Identity()
        in_c = self.spec.in_channels if in_channels is None else in_channels
        out_c = self.spec.out_channels if out_channels is None else out_channels
        key = self._slim_key(choice, in_c, out_c)
        if key is None and choice != "base":
            return Residual(copy.deepcopy(self.alts[choice]), keep_statistics(copy.deepcopy(self.shortcut)),
                            nn.ReLU(inplace=True))
        key = key or "base"
        original = key == "base"
        conv1 = self.conv1 if original else self.conv1w
        conv2 = self.conv2 if original else self.conv2w
        assert conv1 is not None and conv2 is not None
        m = width_channels(self.spec.mid_channels, key)
        d, k = self.spec.dims, self.spec.kernel
        path: nn.Module = nn.Sequential(
            _copy_conv(d, conv1.weight[:m, :in_c].detach(), self.spec.stride, k),
            _keep_if(original, copy.deepcopy(self.bn1[key])),
            nn.ReLU(inplace=True),
            _copy_conv(d, conv2.weight[:out_c, :m].detach(), 1, k),
            _keep_if(original, slice_bn(self.bn2[key], out_c)),
        )
        if original:
            shortcut: nn.Module = keep_statistics(copy.deepcopy(self.shortcut))
        elif self.spec.shortcut == "identity":
            shortcut = nn.Identity()
        elif self.spec.shortcut == "option_a":
            shortcut = OptionAShortcut(in_c, out_c, self.spec.stride, self.spec.dims)
        else:
            assert self.shortcut_w is not None
            shortcut = nn.Sequential(
                slice_conv(self.shortcut_w[0], out_channels=out_c, in_channels=in_c),
                slice_bn(self.shortcut_w[1], out_c),
            )
        return Residual(path, shortcut, nn.ReLU(inplace=True))


class ElasticInvertedResidual(nn.Module):
    """MobileNetV2 block: expand 1x1 -> depthwise k x k -> project 1x1."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.spec = spec
        d, hidden = spec.dims, spec.mid_channels
        self.has_expand = hidden != spec.in_channels
        self.expand = conv(d, spec.in_channels, hidden, 1) if self.has_expand else None
        self.dw = conv(d, hidden, hidden, spec.kernel, spec.stride, groups=hidden)
        self.project = conv(d, hidden, spec.out_channels, 1)
        # Slim widths and SLIM_FULL (any variant but the original) run a trainable,
        # importance-sorted copy (see ElasticBasicBlock).
        widths = [*(c for c in spec.choices if c in WIDTH_RATIOS), SLIM_FULL]
        self.expand_w = conv(d, spec.in_channels, hidden, 1) if self.has_expand else None
        self.dw_w = conv(d, hidden, hidden, spec.kernel, spec.stride, groups=hidden)
        self.project_w = conv(d, hidden, spec.out_channels, 1)
        self.bn_expand = (
            nn.ModuleDict({c: bn(d, width_channels(hidden, c)) for c in widths}) if self.has_expand else None
        )
        self.bn_dw = nn.ModuleDict({c: bn(d, width_channels(hidden, c)) for c in widths})
        self.bn_project = nn.ModuleDict({c: bn(d, spec.out_channels) for c in widths})
        self.alts = nn.ModuleDict()
        if "ghost" in spec.choices:
            self.alts["ghost"] = nn.Sequential(
                GhostUnit(d, spec.in_channels, hidden, 1, 1),
                nn.ReLU6(inplace=True),
                conv_bn(d, hidden, hidden, spec.kernel, spec.stride, groups=hidden),
                nn.ReLU6(inplace=True),
                conv_bn(d, hidden, spec.out_channels, 1),
            )
        self.use_residual = spec.shortcut == "identity"

    def original_modules(self) -> list[nn.Module]:
        mods: list[nn.Module] = [self.dw, self.project, self.bn_dw["base"], self.bn_project["base"]]
        if self.expand is not None and self.bn_expand is not None:
            mods += [self.expand, self.bn_expand["base"]]
        return mods

    def rank_channels(self) -> None:
        """Ranking happens on the slim copy in ``init_alternatives``; the original is untouched."""

    @torch.no_grad()
    def init_alternatives(self) -> None:
        hidden = self.spec.mid_channels
        if self.expand is not None and self.bn_expand is not None:
            importance = self.expand.weight.abs().flatten(1).sum(1) * self.bn_expand["base"].weight.abs()
            order = torch.argsort(importance, descending=True)
        else:
            order = torch.arange(hidden, device=self.dw.weight.device)
        if self.dw_w is not None and self.project_w is not None:
            if self.expand_w is not None and self.expand is not None:
                self.expand_w.weight.copy_(self.expand.weight[order])
            self.dw_w.weight.copy_(self.dw.weight[order])
            self.project_w.weight.copy_(self.project.weight[:, order])
        dicts = [(self.bn_dw, True), (self.bn_project, False)]
        if self.bn_expand is not None:
            dicts.append((self.bn_expand, True))
        for norms, sliced in dicts:
            base = norms["base"]
            for choice, norm in norms.items():
                if choice == "base":
                    continue
                m = width_channels(hidden, choice) if sliced else self.spec.out_channels
                for name in ("weight", "bias", "running_mean", "running_var"):
                    tensor = getattr(base, name)
                    getattr(norm, name).copy_((tensor[order] if sliced else tensor)[:m])
        if "ghost" in self.alts:
            ghost = self.alts["ghost"]
            ghost[2][0].weight.copy_(self.dw.weight)
            ghost[2][1].load_state_dict(self.bn_dw["base"].state_dict())
            ghost[4][0].weight.copy_(self.project.weight)
            ghost[4][1].load_state_dict(self.bn_project["base"].state_dict())

    def _convs(self, choice: str) -> tuple[nn.Module | None, nn.Module, nn.Module]:
        if choice == "base" or self.dw_w is None or self.project_w is None:
            return self.expand, self.dw, self.project
        return self.expand_w, self.dw_w, self.project_w

    def _width_forward(self, x: torch.Tensor, choice: str) -> torch.Tensor:
        m = width_channels(self.spec.mid_channels, choice) if self.has_expand else self.spec.mid_channels
        fn = _conv_fn(self.spec.dims)
        expand, dw, project = self._convs(choice)
        h = x
        if expand is not None and self.bn_expand is not None:
            h = F.relu6(self.bn_expand[choice](fn(h, expand.weight[:m])))
        h = F.relu6(self.bn_dw[choice](fn(h, dw.weight[:m], None, self.spec.stride, self.spec.kernel // 2, 1, m)))
        return self.bn_project[choice](fn(h, project.weight[:, :m]))

    def forward(self, x: torch.Tensor, choice: str) -> torch.Tensor:
        if choice == "skip":
            return x
        out = self._width_forward(x, choice) if choice in self.bn_dw else self.alts[choice](x)
        return out + x if self.use_residual else out

    def materialize(self, choice: str) -> nn.Module:
        if choice == "skip":
            return nn.Identity()
        if choice in self.bn_dw:
            d = self.spec.dims
            m = width_channels(self.spec.mid_channels, choice) if self.has_expand else self.spec.mid_channels
            expand, dw_src, project = self._convs(choice)
            keep = choice == "base"
            layers: list[nn.Module] = []
            if expand is not None and self.bn_expand is not None:
                layers += [
                    _copy_conv(d, expand.weight[:m].detach(), 1, 1),
                    _keep_if(keep, copy.deepcopy(self.bn_expand[choice])),
                    nn.ReLU6(inplace=True),
                ]
            dw = conv(d, m, m, self.spec.kernel, self.spec.stride, groups=m)
            with torch.no_grad():
                dw.weight.copy_(dw_src.weight[:m])
            layers += [dw, _keep_if(keep, copy.deepcopy(self.bn_dw[choice])), nn.ReLU6(inplace=True)]
            layers += [
                _copy_conv(d, project.weight[:, :m].detach(), 1, 1),
                _keep_if(keep, copy.deepcopy(self.bn_project[choice])),
            ]
            path: nn.Module = nn.Sequential(*layers)
        else:
            path = copy.deepcopy(self.alts[choice])
        return Residual(path, nn.Identity() if self.use_residual else None, nn.Identity())
