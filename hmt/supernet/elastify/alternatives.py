"""Operator alternatives for one block of a user model (AdaptiveNet shrunk and merged blocks).

Each alternative is a private copy of the original block with some layers replaced, so
training it never touches the original weights (which stay frozen and exact):

- width ``w75/w50/w25``: inner channels kept by importance (L1 norm of the producing
  filter times the |gamma|/sigma of the BN after it), sliced through BN, activations,
  depthwise convs and squeeze-excitation gates into the consuming conv;
- low rank ``lr50/lr25``: each dense conv as a rank-r k x k then a 1 x 1 conv, from the
  truncated SVD of its weight (exact at full rank);
- depthwise-separable ``dws``: each dense k x k conv as depthwise k x k + pointwise 1 x 1;
- kernel ``k1``: each k x k conv (same padding) as a 1 x 1 conv from the kernel centre;
- ``skip`` where input and output shapes match; ``merge`` (a copy of this block standing
  in for it and the next) where the next block keeps the shape.

An option that finds nothing to change in a block is not offered; the reasons go in the
elastification report.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from hmt.supernet.elastify.frozen import FrozenBatchNorm, unfreeze

WIDTHS = {"w75": 0.75, "w50": 0.5, "w25": 0.25}
RANKS = {"lr50": 0.5, "lr25": 0.25}
CONVS = (nn.Conv1d, nn.Conv2d)

_PASS_MODULES = (
    _BatchNorm,
    FrozenBatchNorm,
    nn.ReLU,
    nn.ReLU6,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.SiLU,
    nn.Sigmoid,
    nn.GELU,
    nn.Tanh,
    nn.LeakyReLU,
    nn.ELU,
    nn.Mish,
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
)
_F = torch.nn.functional
_PASS_FUNCTIONS = {
    torch.relu,
    torch.sigmoid,
    torch.tanh,
    _F.relu,
    _F.relu6,
    _F.hardswish,
    _F.hardsigmoid,
    _F.silu,
    _F.gelu,
    _F.sigmoid,
    _F.dropout,
    _F.max_pool1d,
    _F.max_pool2d,
    _F.avg_pool1d,
    _F.avg_pool2d,
    _F.adaptive_avg_pool1d,
    _F.adaptive_avg_pool2d,
}
_PASS_METHODS = {"relu", "sigmoid", "tanh", "contiguous"}


def _module(gm: fx.GraphModule, node: fx.Node) -> nn.Module | None:
    return gm.get_submodule(str(node.target)) if node.op == "call_module" else None


def _channels(node: fx.Node) -> int | None:
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) >= 2 else None


def _is_dense_conv(m: nn.Module | None) -> bool:
    return isinstance(m, CONVS) and m.groups == 1


def _is_depthwise(m: nn.Module | None) -> bool:
    return isinstance(m, CONVS) and m.groups > 1 and m.groups == m.in_channels == m.out_channels


def _passes(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Per-channel ops: channel i of the output depends only on channel i of the input."""
    if node.op == "call_module":
        return isinstance(_module(gm, node), _PASS_MODULES)
    if node.op == "call_function":
        return node.target in _PASS_FUNCTIONS
    if node.op == "call_method":
        if node.target == "mean":  # spatial mean with keepdim keeps channels
            dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            return keeps_dims(node) and spatial_dims_only(node, dims)
        return node.target in _PASS_METHODS
    return False


def keeps_dims(node: fx.Node) -> bool:
    """A reduction's ``keepdim``, given by name or as its third argument (``x.mean(-1, True)``)."""
    return bool(node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False))


def spatial_dims_only(node: fx.Node, dims: Any) -> bool:
    """Whether ``dims`` (one or several, as a reduction of ``node``'s first argument takes them)
    are spatial dimensions only (2 and up); a negative one counts from the end of that
    argument's rank (``x.mean(-1)`` of a (batch, C, L) tensor is over L)."""
    listed = dims if isinstance(dims, list | tuple) else (dims,)
    source = node.args[0] if node.args else None
    shape = getattr(source.meta.get("tensor_meta"), "shape", None) if isinstance(source, fx.Node) else None
    rank = len(shape) if shape is not None else None
    out_shape = getattr(node.meta.get("tensor_meta"), "shape", None)
    if rank is None and out_shape is not None:  # a block's input carries no shape: the result's rank tells
        rank = len(out_shape) + (0 if keeps_dims(node) else len(listed))

    def spatial(d: Any) -> bool:
        if not isinstance(d, int):
            return False
        return (d + rank if d < 0 and rank is not None else d) >= 2

    return bool(listed) and all(spatial(d) for d in listed)


@dataclass
class ChannelGroup:
    """Channels one dense conv produces and everything that reads them inside the block."""

    producer: str  # module path: out-channels sliced
    co_producers: list[str] = field(default_factory=list)  # SE gates: out-channels sliced
    norms: list[str] = field(default_factory=list)
    depthwise: list[str] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)  # in-channels sliced
    channels: int = 0

    def modules(self) -> list[str]:
        return [self.producer, *self.co_producers, *self.norms, *self.depthwise, *self.consumers]


def _gate_producer(gm: fx.GraphModule, node: fx.Node, group: ChannelGroup, seen: set[fx.Node]) -> bool:
    """Walk back from an SE gate operand through per-channel ops to the dense conv making it."""
    while True:
        if len(node.users) != 1:
            return False
        m = _module(gm, node)
        if _is_dense_conv(m):
            group.co_producers.append(str(node.target))
            return True
        if not _passes(gm, node) or not node.args or not isinstance(node.args[0], fx.Node):
            return False
        if isinstance(m, _BatchNorm | FrozenBatchNorm):
            group.norms.append(str(node.target))
        seen.add(node)
        node = node.args[0]


def channel_groups(gm: fx.GraphModule) -> tuple[list[ChannelGroup], list[str]]:
    """Every prunable channel group of a block graph, and why the others are not."""
    groups, notes = [], []
    calls: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            calls[str(n.target)] = calls.get(str(n.target), 0) + 1
    for start in gm.graph.nodes:
        conv = _module(gm, start)
        if not _is_dense_conv(conv):
            continue
        group = ChannelGroup(str(start.target), channels=int(conv.out_channels))
        reason = _grow(gm, start, group)
        if reason is None and any(calls.get(m, 0) > 1 for m in group.modules()):
            reason = "a module of the group runs more than once"
        if reason is None:
            groups.append(group)
        else:
            notes.append(f"{start.target}: {reason}")
    return groups, notes


def _grow(gm: fx.GraphModule, start: fx.Node, group: ChannelGroup) -> str | None:
    frontier, seen = [start], {start}
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "output":
                return "its channels reach the block output"
            m = _module(gm, user)
            if _is_dense_conv(m) or isinstance(m, nn.Linear):
                if user.args[0] is not node:
                    return f"{user.target} reads it as a non-input argument"
                group.consumers.append(str(user.target))
                continue
            if _is_depthwise(m) or _passes(gm, user):
                if _channels(user) != group.channels:
                    return f"{user.name} changes the channel count"
                if _is_depthwise(m):
                    group.depthwise.append(str(user.target))
                elif isinstance(m, _BatchNorm | FrozenBatchNorm):
                    group.norms.append(str(user.target))
                frontier.append(user)
                continue
            if user.op == "call_function" and user.target in (operator.mul, torch.mul) and len(user.args) == 2:
                other = user.args[1] if user.args[0] is node else user.args[0]
                if not isinstance(other, fx.Node) or other in seen:
                    return f"{user.name} multiplies by something else than an SE gate"
                if not _gate_producer(gm, other, group, seen):
                    return f"{user.name}: the gate is not made by a conv through per-channel ops"
                frontier.append(user)
                continue
            return f"{user.name} ({user.op} {getattr(user.target, '__name__', user.target)}) is not channel-wise"
    if not group.consumers:
        return "no conv consumes its channels"
    return None


def importance(gm: fx.GraphModule, group: ChannelGroup) -> torch.Tensor:
    """L1 norm of each produced filter, times |gamma| / sigma of the first norm after it."""
    conv = gm.get_submodule(group.producer)
    score = conv.weight.detach().abs().flatten(1).sum(1).double()
    return scaled_by_norm(score, gm.get_submodule(group.norms[0]) if group.norms else None)


def scaled_by_norm(score: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
    """``score`` per channel times |gamma| / sigma of ``norm`` where it has them (a norm
    without an affine scale or running statistics leaves the score as it is)."""
    weight, variance = getattr(norm, "weight", None), getattr(norm, "running_var", None)
    if weight is None or weight.shape != score.shape:
        return score
    score = score * weight.detach().abs().double()
    return score if variance is None else score / (variance.double() + norm.eps).sqrt()


def _conv_like(conv: nn.Module, **changes: int) -> nn.Module:
    cls = type(conv)
    args = {
        "in_channels": conv.in_channels,
        "out_channels": conv.out_channels,
        "kernel_size": conv.kernel_size,
        "stride": conv.stride,
        "padding": conv.padding,
        "dilation": conv.dilation,
        "groups": conv.groups,
        "bias": conv.bias is not None,
        "padding_mode": conv.padding_mode,
    }
    args.update(changes)
    return cls(**args)


@torch.no_grad()
def _slice_norm(norm: nn.Module, idx: torch.Tensor) -> nn.Module:
    new = type(norm)(len(idx), eps=norm.eps, momentum=norm.momentum, affine=norm.affine,
                     track_running_stats=norm.track_running_stats)
    if norm.affine:
        new.weight.copy_(norm.weight[idx])
        new.bias.copy_(norm.bias[idx])
    if norm.running_mean is not None:  # None: batch statistics in eval too (track_running_stats=False)
        new.running_mean.copy_(norm.running_mean[idx])
        new.running_var.copy_(norm.running_var[idx])
    return new


@torch.no_grad()
def shrink(block: fx.GraphModule, ratio: float) -> tuple[fx.GraphModule | None, str]:
    """A copy of ``block`` with every prunable group cut to ``ratio`` of its channels."""
    alt = unfreeze(copy.deepcopy(block))
    groups, notes = channel_groups(alt)
    if not groups:
        return None, "no prunable channel group (" + "; ".join(notes[:2]) + ")"
    out_idx: dict[str, torch.Tensor] = {}
    in_idx: dict[str, torch.Tensor] = {}
    norm_idx: dict[str, torch.Tensor] = {}
    for g in groups:
        keep = max(1, round(ratio * g.channels))
        idx = importance(alt, g).argsort(descending=True)[:keep].sort().values
        if any(p in out_idx for p in (g.producer, *g.co_producers)) or any(c in in_idx for c in g.consumers):
            continue
        for p in (g.producer, *g.co_producers):
            out_idx[p] = idx
        for c in g.consumers:
            in_idx[c] = idx
        for n in (*g.norms, *g.depthwise):
            norm_idx[n] = idx
    for path in sorted(set(out_idx) | set(in_idx) | set(norm_idx)):
        old = alt.get_submodule(path)
        if isinstance(old, _BatchNorm):
            alt.set_submodule(path, _slice_norm(old, norm_idx[path]))
            continue
        o = out_idx.get(path, norm_idx.get(path))
        i = in_idx.get(path, norm_idx.get(path) if _is_depthwise(old) else None)
        if isinstance(old, nn.Linear):
            new: nn.Module = nn.Linear(len(i) if i is not None else old.in_features, old.out_features,
                                       bias=old.bias is not None)
            new.weight.copy_(old.weight[:, i] if i is not None else old.weight)
            if old.bias is not None:
                new.bias.copy_(old.bias)
            alt.set_submodule(path, new)
            continue
        weight = old.weight
        if _is_depthwise(old):
            new = _conv_like(old, in_channels=len(o), out_channels=len(o), groups=len(o))
            new.weight.copy_(weight[o])
        else:
            new = _conv_like(old, in_channels=len(i) if i is not None else old.in_channels,
                             out_channels=len(o) if o is not None else old.out_channels)
            weight = weight[o] if o is not None else weight
            new.weight.copy_(weight[:, i] if i is not None else weight)
        if old.bias is not None:
            new.bias.copy_(old.bias[o] if o is not None else old.bias)
        alt.set_submodule(path, new)
    alt.recompile()
    return alt, f"{len(groups)} channel group(s) at {ratio:.0%}"


def _dense_convs(gm: fx.GraphModule) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for n in gm.graph.nodes:
        m = _module(gm, n)
        if m is not None and _is_dense_conv(m):
            out.append((str(n.target), m))
    return out


def _gram_factors(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """U, singular values, V^T of ``weight`` (out, in*k*k) through the eigen-decomposition of
    the smaller Gram matrix (float64): the subspaces of torch.linalg.svd, many times faster
    on CPU for 512 x 4608 weights (hmt.supernet.operators.lowrank does the same)."""
    flat = weight.detach().reshape(weight.shape[0], -1).double()
    if flat.shape[0] <= flat.shape[1]:
        eigvals, u = torch.linalg.eigh(flat @ flat.T)
        u, s = u.flip(1), eigvals.flip(0).clamp_min(0).sqrt().clamp_min(1e-12)
        return u, s, (u.T @ flat) / s[:, None]
    eigvals, v = torch.linalg.eigh(flat.T @ flat)
    v, s = v.flip(1), eigvals.flip(0).clamp_min(0).sqrt().clamp_min(1e-12)
    return (flat @ v) / s[None, :], s, v.T


@torch.no_grad()
def low_rank(
    block: fx.GraphModule, ratios: dict[str, float], *, init: bool = True
) -> dict[str, tuple[fx.GraphModule | None, str]]:
    """Per ratio: each dense conv whose rank pair is smaller than it, as that pair,
    initialised from the truncated SVD (one decomposition per conv serves every ratio)."""
    factors: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    out: dict[str, tuple[fx.GraphModule | None, str]] = {}
    for choice, ratio in ratios.items():
        alt = unfreeze(copy.deepcopy(block))
        done = 0
        for path, conv in _dense_convs(alt):
            k = int(torch.tensor(conv.kernel_size).prod())
            full = min(conv.out_channels, conv.in_channels * k)
            rank = max(1, round(ratio * full))
            if rank * (conv.in_channels * k + conv.out_channels) >= conv.out_channels * conv.in_channels * k:
                continue
            reduce = _conv_like(conv, out_channels=rank, bias=False)
            expand = _conv_like(conv, in_channels=rank, kernel_size=1, stride=1, padding=0, dilation=1,
                                padding_mode="zeros")
            if init:
                if path not in factors:
                    factors[path] = _gram_factors(conv.weight)
                u, s, vh = factors[path]
                root = s[:rank].sqrt()
                reduce.weight.copy_((root[:, None] * vh[:rank]).reshape(reduce.weight.shape))
                expand.weight.copy_((u[:, :rank] * root[None, :]).reshape(expand.weight.shape))
                if conv.bias is not None:
                    expand.bias.copy_(conv.bias)
            alt.set_submodule(path, nn.Sequential(reduce, expand))
            done += 1
        if done:
            alt.recompile()
            out[choice] = (alt, f"{done} conv(s) at rank {ratio:.0%}")
        else:
            out[choice] = (None, "no dense conv that a low-rank pair would make smaller")
    return out


def depthwise_separable(block: fx.GraphModule) -> tuple[fx.GraphModule | None, str]:
    """Each dense k x k conv (k > 1) as depthwise k x k + pointwise 1 x 1 (fresh weights)."""
    alt = unfreeze(copy.deepcopy(block))
    done = 0
    for path, conv in _dense_convs(alt):
        if max(conv.kernel_size) == 1 or conv.in_channels < 2:
            continue
        dw = _conv_like(conv, out_channels=conv.in_channels, groups=conv.in_channels, bias=False)
        pw = _conv_like(conv, kernel_size=1, stride=1, padding=0, dilation=1, padding_mode="zeros")
        alt.set_submodule(path, nn.Sequential(dw, pw))
        done += 1
    if not done:
        return None, "no dense k x k conv"
    alt.recompile()
    return alt, f"{done} conv(s) made depthwise-separable"


@torch.no_grad()
def kernel_one(block: fx.GraphModule) -> tuple[fx.GraphModule | None, str]:
    """Each k x k conv with 'same' padding as a 1 x 1 conv holding the kernel's centre."""
    alt = unfreeze(copy.deepcopy(block))
    done = 0
    for n in list(alt.graph.nodes):
        conv = _module(alt, n)
        if not isinstance(conv, CONVS) or max(conv.kernel_size) == 1 or isinstance(conv.padding, str):
            continue
        same = all(p == d * (k - 1) // 2 and k % 2 == 1
                   for p, d, k in zip(conv.padding, conv.dilation, conv.kernel_size, strict=True))
        if not same:
            continue
        new = _conv_like(conv, kernel_size=1, padding=0, dilation=1, padding_mode="zeros")
        centre = tuple(k // 2 for k in conv.kernel_size)
        new.weight.copy_(conv.weight[(slice(None), slice(None), *centre)].reshape(new.weight.shape))
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
        alt.set_submodule(str(n.target), new)
        done += 1
    if not done:
        return None, "no k x k conv with 'same' padding"
    alt.recompile()
    return alt, f"{done} conv(s) cut to 1 x 1"


def merged(block: fx.GraphModule) -> fx.GraphModule:
    """A trainable copy of this block, to stand in for it and the next (AdaptiveNet merge)."""
    alt = unfreeze(copy.deepcopy(block))
    alt.recompile()
    return alt
