"""The stream-width side of an elastified supernet: parents, slim units, index sets.

``StreamWidths`` holds, for the stem, every block position and the head, a trainable
copy of the original (its parent) and the units that run it on narrower streams
(``hmt.supernet.elastify.stream``), plus the index sets of every width. Boundary ``-1``
is the stem's output, boundary ``p`` block position ``p``'s output; blocks whose identity
shortcut ties their input to their output put both boundaries in one stream group.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import fx, nn

from hmt.supernet.elastify.frozen import unfreeze
from hmt.supernet.elastify.stream import (
    FULL,
    INNER_WIDTHS,
    Indices,
    SlicePlan,
    build_unit,
    keep_count,
    slice_plan,
    stream_scores,
    top_index,
)
from hmt.supernet.space import CHOICE_CODES


class StreamUnavailable(Exception):
    """Why this model gets no stream widths (a layer on the stream hmt cannot slice)."""


def _block_name(position: int, stage_of: dict[int, int]) -> str:
    """A block as the elastification report names it: stage and index within the stage."""
    stage = stage_of[position]
    return f"block s{stage}.b{sorted(p for p in stage_of if stage_of[p] == stage).index(position)}"


def _plan(part: str, gm: fx.GraphModule, **kwargs: bool) -> SlicePlan:
    """``slice_plan`` of one part of the model, its refusal naming the part."""
    try:
        return slice_plan(gm, **kwargs)
    except ValueError as exc:
        raise StreamUnavailable(f"{part}: {exc}") from exc


def unit_name(choice: str, in_w: str, out_w: str) -> str:
    """ModuleDict key of a slim unit: ``full_B5`` (full inner width, base in, 50% out)."""
    return f"{choice}_{CHOICE_CODES[in_w]}{CHOICE_CODES[out_w]}"


class WidthSlot(nn.Module):
    """The module at a stream-width position, so ``blocks[p]`` lines up with
    ``space.positions[p]``: runs and holds nothing (the supernet applies the width)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Identity()
        self.alts = nn.ModuleDict()
        self.choices: tuple[str, ...] = ()

    def forward(self, x: torch.Tensor, choice: str = "base") -> torch.Tensor:
        return x

    def materialize(self, choice: str) -> nn.Module:
        return nn.Identity()


class _UnionFind:
    def __init__(self, items: list[int]) -> None:
        self.parent = {i: i for i in items}

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(b)] = self.find(a)


class StreamWidths(nn.Module):
    def __init__(
        self,
        stem: fx.GraphModule,
        bases: dict[int, fx.GraphModule],
        head: fx.GraphModule,
        stage_of: dict[int, int],
        levels: dict[int, tuple[str, ...]],
        inner: dict[int, tuple[str, ...]],
        *,
        init: bool,
    ) -> None:
        """``bases``: {block position: original block}; ``stage_of``: their stages;
        ``levels``: {stage: stream widths offered besides base}; ``inner``: {position:
        inner widths the block offers}. Raises StreamUnavailable."""
        super().__init__()
        self.positions = sorted(bases)
        self.levels = levels
        self.stage_of = stage_of
        self.indices = Indices()
        self.stem_parent = unfreeze(copy.deepcopy(stem))
        self.head_parent = unfreeze(copy.deepcopy(head))
        self.parents = nn.ModuleDict({str(p): unfreeze(copy.deepcopy(bases[p])) for p in self.positions})
        self.stem_plan = _plan("the stem", self.stem_parent, reads_stream=False)
        self.head_plan = _plan("the head", self.head_parent, writes_stream=False)
        self.plans = {p: _plan(_block_name(p, stage_of), self.parents[str(p)]) for p in self.positions}
        self.previous = {p: (self.positions[i - 1] if i else -1) for i, p in enumerate(self.positions)}
        self._group_boundaries()
        self._rank(init)
        self.stem_units = nn.ModuleDict({
            w: build_unit(self.stem_parent, self.stem_plan, self.indices, {"out": w}, {"out": self.group_of[-1]})
            for w in levels[0]})
        last = self.positions[-1]
        self.head_units = nn.ModuleDict({
            w: build_unit(self.head_parent, self.head_plan, self.indices, {"in": w}, {"in": self.group_of[last]})
            for w in levels[stage_of[last]]})
        self.units = nn.ModuleDict({str(p): self._block_units(p, inner.get(p, ())) for p in self.positions})

    def boundary_stage(self, b: int) -> int:
        return 0 if b == -1 else self.stage_of[b]

    def _group_boundaries(self) -> None:
        uf = _UnionFind([-1, *self.positions])
        for p in self.positions:
            if self.plans[p].tied:
                prev = self.previous[p]
                if self.boundary_stage(prev) != self.stage_of[p]:
                    raise StreamUnavailable(f"{_block_name(p, self.stage_of)} adds its input to its output across "
                                            "stages")
                uf.union(prev, p)
        roots = sorted({uf.find(b) for b in [-1, *self.positions]})
        self.group_of = {b: f"s{roots.index(uf.find(b))}" for b in [-1, *self.positions]}

    def _channels(self, b: int) -> int:
        if b == -1:
            node: Any = self.stem_parent.graph.output_node().args[0]
        else:
            node = self.parents[str(b)].graph.output_node().args[0]
        return int(node.meta["tensor_meta"].shape[1])

    def _rank(self, init: bool) -> None:
        """Index sets of every stream group and inner group at every width."""
        scores: dict[str, torch.Tensor] = {}
        channels: dict[str, int] = {}

        def add(group: str, score: torch.Tensor | None, count: int) -> None:
            if channels.setdefault(group, count) != count:
                raise StreamUnavailable(f"stream group {group} joins tensors of {channels[group]} and {count} channels")
            if score is not None:
                scores[group] = scores[group] + score if group in scores else score

        add(self.group_of[-1], stream_scores(self.stem_parent, self.stem_plan, "out") if init else None,
            self._channels(-1))
        for p in self.positions:
            gm, plan = self.parents[str(p)], self.plans[p]
            add(self.group_of[self.previous[p]], stream_scores(gm, plan, "in") if init else None,
                self._channels(self.previous[p]))
            add(self.group_of[p], stream_scores(gm, plan, "out") if init else None, self._channels(p))
        last = self.positions[-1]
        add(self.group_of[last], stream_scores(self.head_parent, self.head_plan, "in") if init else None,
            self._channels(last))
        self.group_channels = channels
        all_levels = sorted({w for ws in self.levels.values() for w in ws})
        for group, count in channels.items():
            score = scores.get(group, torch.arange(count, 0, -1).double())
            for w in all_levels:
                k = keep_count(count, w)
                self.indices.add(f"{group}.{w}", top_index(score, k) if init else torch.zeros(k))
        for p in self.positions:
            for name, count, score in self.plans[p].inner:
                for w in INNER_WIDTHS:
                    k = keep_count(count, w)
                    self.indices.add(f"p{p}{name}.{w}", top_index(score, k) if init else torch.zeros(k))

    def width_pairs(self, p: int) -> list[tuple[str, str]]:
        """(input width, output width) pairs block ``p`` may run slim."""
        prev = self.previous[p]
        ins = ("base", *self.levels[self.boundary_stage(prev)])
        outs = ("base", *self.levels[self.stage_of[p]])
        same = self.group_of[prev] == self.group_of[p] or self.boundary_stage(prev) == self.stage_of[p]
        return [(i, o) for i in ins for o in outs if (i, o) != ("base", "base") and (not same or i == o)]

    def _block_units(self, p: int, inner: tuple[str, ...]) -> nn.ModuleDict:
        plan: SlicePlan = self.plans[p]
        parent = self.parents[str(p)]
        names = {"in": self.group_of[self.previous[p]], "out": self.group_of[p]}
        names.update({g: f"p{p}{g}" for g, _, _ in plan.inner})
        units = {}
        for in_w, out_w in self.width_pairs(p):
            for choice in (FULL, *inner):
                widths = {"in": in_w, "out": out_w}
                if choice != FULL:
                    widths.update({g: choice for g, _, _ in plan.inner})
                units[unit_name(choice, in_w, out_w)] = build_unit(parent, plan, self.indices, widths, names)
        return nn.ModuleDict(units)

    def index(self, boundary: int, width: str) -> torch.Tensor | None:
        return None if width == "base" else self.indices.get(f"{self.group_of[boundary]}.{width}")

    def unit(self, p: int, choice: str, in_w: str, out_w: str) -> nn.Module:
        return self.units[str(p)][unit_name(FULL if choice == "base" else choice, in_w, out_w)]

    def trainable(self) -> list[nn.Parameter]:
        return [q for q in self.parameters() if q.requires_grad]
