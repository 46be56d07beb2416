"""Stream widths for elastified models: the residual stream (every block's input and
output channels, the stem's output, the head's input) run narrower, per stage.

A dependency analysis over each traced block finds which layers read the block's input
channels (``in``), which write its output channels (``out``, through BN, activations and
residual adds) and the inner channel groups (``hmt.supernet.elastify.alternatives``); an
identity shortcut ties a block's input channels to its output channels, so the stream
boundaries a chain of residual blocks joins share one channel ranking (union-find).
Channels are ranked by importance (the L1 norm of the weights that read them, plus the
L1 norm of the filters that write them times the |gamma|/sigma of the BN after). A width
keeps the top ``round(ratio * C)`` channels, so the widths nest.

Slim units never touch the original: every block (and the stem and the head) gets one
trainable copy of the original (its *parent*), and each (inner width, input width, output
width) unit runs the parent's convs sliced to its channel index sets (``SlicedLinear``:
shared weights, as Once-for-All shares them) with batch norms of its own (private BNs per
width, initialised from the parent's, sliced). Index sets are buffers, so an artifact
rebuilt without the original's weights gets them back from its weights file.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from hmt.supernet.elastify.alternatives import (
    _conv_like,
    _is_dense_conv,
    _is_depthwise,
    _module,
    _passes,
    _slice_norm,
    channel_groups,
    importance,
    scaled_by_norm,
    spatial_dims_only,
)
from hmt.supernet.elastify.frozen import FrozenBatchNorm
from hmt.supernet.exits import to_channels_first
from hmt.supernet.space import WIDTH_RATIOS

# Operators that turn stream widths on (opt-in, as for the built-in backbones).
STREAM_OPERATORS = {"sw75": "w75", "sw50": "w50", "sw25": "w25"}
INNER_WIDTHS = ("w75", "w50", "w25")
# The parent at full inner width on a slim stream (the built-in supernet's SLIM_FULL).
FULL = "full"
_FLATTEN = {torch.flatten, torch.squeeze}
_FLATTEN_METHODS = {"flatten", "view", "reshape", "squeeze"}


def stream_levels(operators: tuple[str, ...] | None) -> tuple[str, ...]:
    """The stream widths the operators ask for (none unless named: sw75, sw50, sw25)."""
    if operators is None:
        return ()
    return tuple(w for op, w in STREAM_OPERATORS.items() if op in operators)


def keep_count(channels: int, width: str) -> int:
    return channels if width in ("base", FULL) else max(1, round(channels * WIDTH_RATIOS[width]))


@dataclass
class SlicePlan:
    """Per module path of one block graph: the group its output channels and its input
    channels follow (``in``, ``out``, ``g0``.., or None: all)."""

    out_of: dict[str, str | None] = field(default_factory=dict)
    in_of: dict[str, str | None] = field(default_factory=dict)
    norms: dict[str, str] = field(default_factory=dict)  # BN path -> group
    tied: bool = False  # an identity shortcut adds the input to the output
    inner: list[tuple[str, int, torch.Tensor]] = field(default_factory=list)  # (group, channels, importance)
    in_readers: list[str] = field(default_factory=list)  # dense layers reading the input channels
    out_writers: list[tuple[str, str | None]] = field(default_factory=list)  # (conv, BN after it) writing the output


def _is_flatten(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A flatten of a (batch, C, 1, ...) tensor keeps channel i at position i."""
    flat = (node.op == "call_function" and node.target in _FLATTEN) or (
        node.op == "call_method" and node.target in _FLATTEN_METHODS) or isinstance(_module(gm, node), nn.Flatten)
    if not flat or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    shape = getattr(node.args[0].meta.get("tensor_meta"), "shape", None)
    return shape is not None and all(int(d) == 1 for d in shape[2:])


def _is_spatial_mean(node: fx.Node) -> bool:
    """A mean (or amax) over spatial dimensions only, keeping channel i at position i."""
    fn = (node.op == "call_method" and node.target in ("mean", "amax")) or (
        node.op == "call_function" and node.target in (torch.mean, torch.amax))
    if not fn:
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return spatial_dims_only(node, dims)


def _batch_size_only(node: fx.Node) -> bool:
    """``x.size(0)`` or ``x.shape[0]``: reads the batch size, not the channels (``x.view(x.size(0),
    -1)`` before a classifier)."""
    if node.op == "call_method" and node.target == "size":
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        return isinstance(dim, int) and dim == 0
    if node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",):
        return bool(node.users) and all(u.op == "call_function" and u.target is operator.getitem
                                        and u.args[1:] == (0,) for u in node.users)
    return False


def _set(table: dict[str, str | None], path: str, group: str | None) -> None:
    if table.get(path, group) != group:
        raise ValueError(f"{path} is in two channel groups")
    table[path] = group


def _walk_input(gm: fx.GraphModule, plan: SlicePlan) -> None:
    """Layers reading the block's input channels, through per-channel ops."""
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    frontier, seen = [placeholder], {placeholder}
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            m = _module(gm, user)
            if user.op == "output":
                plan.tied = True
            elif _batch_size_only(user):
                continue
            elif user.op == "call_function" and user.target in (operator.add, torch.add):
                plan.tied = True  # the add's other side must write the same channels: checked by the output walk
            elif _is_dense_conv(m) or isinstance(m, nn.Linear):
                if user.args[0] is not node:
                    raise ValueError(f"{user.target} reads the input as a non-input argument")
                _set(plan.in_of, str(user.target), "in")
                plan.in_readers.append(str(user.target))
            elif _is_depthwise(m) or _passes(gm, user) or _is_flatten(gm, user) or _is_spatial_mean(user):
                if isinstance(m, _BatchNorm | FrozenBatchNorm):
                    plan.norms[str(user.target)] = "in"
                elif _is_depthwise(m):
                    _set(plan.out_of, str(user.target), "in")
                frontier.append(user)
            else:
                what = getattr(user.target, "__name__", user.target)
                raise ValueError(f"{user.name} ({what}) reads the stream other than channel by channel")


def _walk_output(gm: fx.GraphModule, plan: SlicePlan, has_output_stream: bool) -> None:
    """Layers writing the block's output channels: back from the output through per-channel
    ops and residual adds to the convs that produce them."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    frontier: list[tuple[fx.Node, str | None]] = [(out_node.args[0], None)]
    seen: set[fx.Node] = set()
    while frontier:
        node, norm = frontier.pop()
        if node in seen or not isinstance(node, fx.Node):
            continue
        seen.add(node)
        m = _module(gm, node)
        if node.op == "placeholder":
            plan.tied = True
        elif node.op == "call_function" and node.target in (operator.add, torch.add):
            frontier += [(a, None) for a in node.args if isinstance(a, fx.Node)]
        elif _is_dense_conv(m) or isinstance(m, nn.Linear):
            if has_output_stream:
                _set(plan.out_of, str(node.target), "out")
                plan.out_writers.append((str(node.target), norm))
        elif (_is_depthwise(m) or _passes(gm, node)) and has_output_stream:
            if isinstance(m, _BatchNorm | FrozenBatchNorm):
                plan.norms[str(node.target)] = "out"
                norm = norm or str(node.target)
            elif _is_depthwise(m):
                _set(plan.out_of, str(node.target), "out")
                _set(plan.in_of, str(node.target), "out")
            frontier.append((node.args[0], norm))
        elif has_output_stream:
            raise ValueError(f"{node.name} ({getattr(node.target, '__name__', node.target)}) writes the stream other "
                             "than channel by channel")


def slice_plan(gm: fx.GraphModule, *, reads_stream: bool = True, writes_stream: bool = True) -> SlicePlan:
    """Which channels every layer of a block follows; ValueError where the block cannot
    run on a narrower stream (anything but convs, linears and per-channel ops on it)."""
    plan = SlicePlan()
    if reads_stream:
        _walk_input(gm, plan)
    if writes_stream:
        _walk_output(gm, plan, True)
    if plan.tied and not (reads_stream and writes_stream):
        raise ValueError("the input reaches the output")
    groups, _ = channel_groups(gm)
    for i, g in enumerate(groups):
        if (any(p in plan.out_of for p in (g.producer, *g.co_producers, *g.depthwise))
                or any(c in plan.in_of for c in (*g.consumers, *g.depthwise))
                or any(n in plan.norms for n in g.norms)):
            continue  # shares a layer side with the stream: the group keeps its channels
        name = f"g{i}"
        try:
            for p in (g.producer, *g.co_producers):
                _set(plan.out_of, p, name)
            for c in g.consumers:
                _set(plan.in_of, c, name)
        except ValueError:
            continue
        for n in g.norms:
            plan.norms[n] = name
        for d in g.depthwise:
            plan.out_of[d] = name
            plan.in_of[d] = name
        plan.inner.append((name, g.channels, importance(gm, g)))
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            raise ValueError(f"reads the tensor {node.target} directly")
        m = _module(gm, node)
        if m is None or not any(True for _ in m.parameters(recurse=False)):
            continue
        if not isinstance(m, nn.Conv1d | nn.Conv2d | nn.Linear | _BatchNorm | FrozenBatchNorm):
            raise ValueError(f"{node.target} ({type(m).__name__}) has weights hmt cannot slice")
        grouped = isinstance(m, nn.Conv1d | nn.Conv2d) and m.groups > 1 and not _is_depthwise(m)
        if grouped or getattr(m, "padding_mode", "zeros") != "zeros":
            raise ValueError(f"{node.target}: grouped or non-zero-padded conv")
    return plan


def stream_scores(gm: fx.GraphModule, plan: SlicePlan, side: str) -> torch.Tensor | None:
    """Importance of each input (``in``) or output (``out``) channel, each layer's share
    normalised to mean 1."""
    parts: list[torch.Tensor] = []
    if side == "in":
        for path in plan.in_readers:
            w = gm.get_submodule(path).weight.detach().double()
            parts.append(w.abs().transpose(0, 1).flatten(1).sum(1))
    else:
        for path, norm_path in plan.out_writers:
            w = gm.get_submodule(path).weight.detach().double()
            score = w.abs().flatten(1).sum(1)
            parts.append(scaled_by_norm(score, gm.get_submodule(norm_path) if norm_path else None))
    parts = [p / p.mean().clamp_min(1e-12) for p in parts]
    return torch.stack(parts).sum(0) if parts else None


def top_index(score: torch.Tensor, keep: int) -> torch.Tensor:
    return score.argsort(descending=True)[:keep].sort().values


class Indices(nn.Module):
    """The channel index sets of every stream and inner group at every width, as buffers
    (``<name>.<width>``), so they travel in the weights file."""

    def add(self, name: str, index: torch.Tensor) -> None:
        self.register_buffer(name.replace(".", "_"), index.long().clone())

    def get(self, name: str | None) -> torch.Tensor | None:
        return None if name is None else getattr(self, name.replace(".", "_"))


class SlicedLinear(nn.Module):
    """A conv or linear layer of a parent run on index sets of its output and input
    channels. Holds no weights of its own (the parent registers them), so a state dict
    has each weight once."""

    def __init__(self, source: nn.Module, indices: Indices, out_key: str | None, in_key: str | None) -> None:
        super().__init__()
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_indices", indices)
        self.out_key, self.in_key = out_key, in_key

    def sliced(self) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        src: Any = self._source
        o = self._indices.get(self.out_key)
        i = self._indices.get(self.in_key)
        weight: torch.Tensor = src.weight if o is None else src.weight.index_select(0, o)
        bias: torch.Tensor | None = src.bias if (src.bias is None or o is None) else src.bias.index_select(0, o)
        if _is_depthwise(src):
            return weight, bias, weight.shape[0]
        if i is not None:
            weight = weight.index_select(1, i)
        return weight, bias, 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        src: nn.Module = self._source  # type: ignore[assignment]
        weight, bias, groups = self.sliced()
        if isinstance(src, nn.Linear):
            return F.linear(x, weight, bias)
        fn = F.conv2d if isinstance(src, nn.Conv2d) else F.conv1d
        return fn(x, weight, bias, src.stride, src.padding, src.dilation, groups)

    @torch.no_grad()
    def plain(self) -> nn.Module:
        """An ordinary layer holding a copy of the sliced weights."""
        src: nn.Module = self._source  # type: ignore[assignment]
        weight, bias, groups = self.sliced()
        if isinstance(src, nn.Linear):
            new: nn.Module = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        else:
            new = _conv_like(src, in_channels=weight.shape[1] * groups, out_channels=weight.shape[0], groups=groups)
        new = new.to(weight.device)
        new.weight.copy_(weight)
        if bias is not None:
            new.bias.copy_(bias)
        return new


def _key(group: str | None, widths: dict[str, str], names: dict[str, str]) -> str | None:
    """The Indices key of ``group`` at its width in this unit (None: all channels)."""
    if group is None or widths.get(group, "base") in ("base", FULL):
        return None
    return f"{names[group]}.{widths[group]}"


def build_unit(parent: fx.GraphModule, plan: SlicePlan, indices: Indices, widths: dict[str, str],
               names: dict[str, str]) -> fx.GraphModule:
    """``parent`` run at ``widths`` ({group: width}): sliced layers sharing the parent's
    weights, private BNs sliced from the parent's."""
    graph = fx.Graph()
    out = graph.graph_copy(parent.graph, {})
    graph.output(out)
    unit = fx.GraphModule(parent, graph, "SlimUnit")
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        path = str(node.target)
        m = parent.get_submodule(path)
        if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Linear):
            o, i = plan.out_of.get(path), plan.in_of.get(path)
            unit.set_submodule(path, SlicedLinear(m, indices, _key(o, widths, names), _key(i, widths, names)))
        elif isinstance(m, _BatchNorm):
            key = _key(plan.norms.get(path), widths, names)
            idx = indices.get(key)
            unit.set_submodule(path, _slice_norm(m, idx if idx is not None else torch.arange(m.num_features)))
        elif any(True for _ in m.parameters()):
            unit.set_submodule(path, copy.deepcopy(m))
    unit.recompile()
    return unit


@torch.no_grad()
def plain_unit(unit: fx.GraphModule) -> fx.GraphModule:
    """A deployable copy of a unit: sliced layers become ordinary ones."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(unit.graph, {}))
    holder = nn.Module()
    for node in unit.graph.nodes:
        if node.op == "call_module":
            m = unit.get_submodule(str(node.target))
            new = m.plain() if isinstance(m, SlicedLinear) else copy.deepcopy(m)
            _put(holder, str(node.target), new)
    out = fx.GraphModule(holder, graph, "SlimUnit")
    return out.eval()


def _put(root: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            root.add_module(name, nn.Module())
        root = getattr(root, name)
    root.add_module(leaf, module)


def exit_forward(head: nn.Module, x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """An early exit head (ExitHead) reading stream channels ``index`` of its full input."""
    if index is None:
        return head(x)
    if getattr(head, "channels_last", False):
        x = to_channels_first(x)
    conv, norm, act = list(head.features)
    fn = F.conv2d if isinstance(conv, nn.Conv2d) else F.conv1d
    h = act(norm(fn(x, conv.weight.index_select(1, index), conv.bias, conv.stride, conv.padding)))
    return head.linear(head.dropout(torch.flatten(head.pool(h), 1)))


@torch.no_grad()
def slice_exit(head: nn.Module, index: torch.Tensor) -> nn.Module:
    out = copy.deepcopy(head)
    conv = head.features[0]
    new = _conv_like(conv, in_channels=len(index)).to(conv.weight.device)
    new.weight.copy_(conv.weight.index_select(1, index))
    if conv.bias is not None:
        new.bias.copy_(conv.bias)
    features: Any = out.features
    features[0] = new
    return out
