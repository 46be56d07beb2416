"""The elastified supernet: the user's model cut into blocks, each with its alternatives.

It speaks the vocabulary of ``hmt.supernet.supernet.Supernet`` (``space``, ``stem``,
``entries``, ``blocks[p].materialize(choice)``, ``exits``, ``forward(x, arch)``,
``forward_exits``, ``materialize``, ``iter_block_choices``, ``variant_blocks``), so
profile-device, pareto, convert, fuse, deploy and serve use it unchanged. The original
blocks, stem and head stay frozen (their batch norms are ``FrozenBatchNorm``), so the
largest variant computes what the user's model computes; only alternatives and the early
exits train, unless ``--finetune-original`` unfreezes the original too.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import fx, nn

from hmt.errors import ModelError
from hmt.supernet.elastify import alternatives as alt_ops
from hmt.supernet.elastify.frozen import freeze
from hmt.supernet.elastify.graph import ModelPlan, channels_last, plan_model, submodule_of
from hmt.supernet.elastify.stream import INNER_WIDTHS, exit_forward, stream_levels
from hmt.supernet.elastify.trace import propagate_shapes, trace_model
from hmt.supernet.elastify.widths import StreamUnavailable, StreamWidths, WidthSlot
from hmt.supernet.exits import ExitHead
from hmt.supernet.space import NOT_EXECUTED, WIDTH_KIND, ArchConfig, BlockPosition, SearchSpace
from hmt.supernet.supernet import BlockChoiceRef, VariantModule, materialize_units

# The order choices appear in a position (and so in the space JSON).
CHOICE_ORDER = ("base", "w75", "w50", "w25", "lr50", "lr25", "dws", "k1", "skip", "merge")


@dataclass
class BlockReport:
    """What elastification did to one block (the report lists every block, kept or not)."""

    name: str
    owner: str | None
    kind: str
    modules: list[str]
    in_shape: list[int]
    out_shape: list[int]
    choices: list[str]
    notes: dict[str, str] = field(default_factory=dict)


class ElasticBlock(nn.Module):
    """One block of the original model (``base``, frozen) and its alternatives."""

    def __init__(self, base: nn.Module, alts: dict[str, nn.Module], choices: tuple[str, ...]) -> None:
        super().__init__()
        self.base = base
        self.alts = nn.ModuleDict(alts)
        self.choices = choices

    def forward(self, x: torch.Tensor, choice: str = "base") -> torch.Tensor:
        if choice == "base":
            return self.base(x)
        if choice == "skip":
            return x
        return self.alts[choice](x)

    def materialize(self, choice: str) -> nn.Module:
        if choice == "skip":
            return nn.Identity()
        module = self.base if choice == "base" else self.alts[choice]
        return copy.deepcopy(module).eval()


def _tag(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:40] or "model"


def _stride(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> int:
    if len(in_shape) < 3 or len(out_shape) < 3 or out_shape[2] == 0:
        return 1
    return max(1, in_shape[2] // out_shape[2])


class ElastifiedSupernet(nn.Module):
    # A ``base`` choice on full streams runs the original's frozen block in every variant; the
    # copies (``full``) exist only slim: hmt.runtime.blocks.ORIGINALS.
    original_units = "full-stream"

    def __init__(
        self,
        model: nn.Module,
        *,
        name: str,
        input_shape: tuple[int, ...],
        leaves: tuple[str, ...] = (),
        operators: tuple[str, ...] | None = None,
        seed: int = 0,
        init: bool = True,
    ) -> None:
        """``model`` is consumed (traced and shared, so pass a copy); ``input_shape``
        excludes the batch. ``init=False`` skips the SVD and importance work (the weights
        are loaded next, as when an artifact is rebuilt)."""
        super().__init__()
        gm = trace_model(model, leaves)
        propagate_shapes(gm, torch.zeros(2, *input_shape))
        plan = plan_model(gm, set(leaves))
        freeze(gm)
        self.plan_dims = plan.dims
        self.original_frozen = True
        out_shape = plan.head.out_shape
        if len(out_shape) != 2:
            raise ModelError(f"cannot elastify: the model returns shape {out_shape}, expected (batch, classes)")
        num_classes = int(out_shape[1])
        self.stem: nn.Module = submodule_of(gm, plan.stem, "Stem") if plan.stem is not None else nn.Identity()
        self.reports: list[BlockReport] = []
        with torch.random.fork_rng():
            # Fresh weights (depthwise-separable units, exit heads) draw from torch's global
            # generator; seed it in a scope so the same seed gives the same supernet.
            torch.manual_seed(seed)
            blocks, positions = self._elastic_blocks(gm, plan, operators, init)
            num_stages = plan.num_stages
            self.entries = nn.ModuleList([nn.Identity() for _ in range(num_stages)])
            self.exits = self._exit_heads(gm, plan, num_classes)
        self.stream: StreamWidths | None = None
        self.stream_note = ""
        levels = stream_levels(operators)
        if levels:
            self.stream, self.stream_note = self._stream_widths(plan, blocks, positions, levels, init)
        if self.stream is not None:
            modules, positions = _with_width_slots(blocks, positions, plan, levels)
        else:
            modules = list(blocks)
        self.blocks = nn.ModuleList(modules)
        self.stage_of = [pos.stage for pos in positions]
        self.space = SearchSpace(
            backbone=_tag(name),
            num_classes=num_classes,
            input_shape=tuple(input_shape),
            num_stages=num_stages,
            positions=tuple(positions),
        )
        self.head_modules = plan.head.module_paths()
        self.stem_modules = plan.stem.module_paths() if plan.stem is not None else []
        self._input_shapes: dict[str, tuple[int, ...]] | None = None
        self.set_original_frozen(True)

    # -- building ----------------------------------------------------------------------

    def _elastic_blocks(self, gm: fx.GraphModule, plan: ModelPlan, operators: tuple[str, ...] | None,
                        init: bool) -> tuple[list[ElasticBlock], list[BlockPosition]]:
        """One elastic block per planned block, its alternatives and its position in the space
        (named ``s{stage}.b{index}``); each block's report joins ``self.reports``."""
        positions: list[BlockPosition] = []
        blocks: list[ElasticBlock] = []
        for p, block_plan in enumerate(plan.blocks):
            base = submodule_of(gm, block_plan, "Block")
            choices, alts, report = self._alternatives(p, plan, base, operators, init)
            blocks.append(ElasticBlock(base, alts, choices))
            stage = plan.stages[p]
            index = sum(1 for q in range(p) if plan.stages[q] == stage)
            report.name = f"s{stage}.b{index}"
            self.reports.append(report)
            positions.append(BlockPosition(
                name=report.name, stage=stage, index=index, kind=block_plan.kind,
                in_channels=int(block_plan.in_shape[1]), out_channels=int(block_plan.out_shape[1]),
                stride=_stride(block_plan.in_shape, block_plan.out_shape), choices=choices,
            ))
        return blocks, positions

    @staticmethod
    def _exit_heads(gm: fx.GraphModule, plan: ModelPlan, num_classes: int) -> nn.ModuleList:
        """A fresh exit head after every stage but the last, then the model's own head."""
        exits: list[nn.Module] = []
        for s in range(plan.num_stages - 1):
            last = max(p for p in range(len(plan.blocks)) if plan.stages[p] == s)
            features = plan.blocks[last].out_shape  # each exit takes its stage's features, 1-D or 2-D
            if channels_last(gm, plan.blocks[last]):  # (N, H, W, C): a transformer's stage (Swin, ConvNeXt)
                exits.append(ExitHead(len(features) - 2, int(features[-1]), num_classes, channels_last=True))
            else:
                exits.append(ExitHead(len(features) - 2, int(features[1]), num_classes))
        exits.append(submodule_of(gm, plan.head, "Head"))
        return nn.ModuleList(exits)

    def _alternatives(
        self, p: int, plan: ModelPlan, base: fx.GraphModule, operators: tuple[str, ...] | None, init: bool
    ) -> tuple[tuple[str, ...], dict[str, nn.Module], BlockReport]:
        block = plan.blocks[p]
        wanted = set(operators) if operators is not None else set(CHOICE_ORDER)
        report = BlockReport("", block.owner, block.kind, block.module_paths()[:50], list(block.in_shape),
                             list(block.out_shape), [])
        candidates: dict[str, tuple[nn.Module | None, str]] = {}
        if block.kind == "opaque":
            report.notes["all"] = f"kept unchanged: opaque leaf module(s) {', '.join(block.leaves)}"
        else:
            for choice, ratio in alt_ops.WIDTHS.items():
                if choice in wanted:
                    candidates[choice] = alt_ops.shrink(base, ratio)
            ranks = {c: r for c, r in alt_ops.RANKS.items() if c in wanted}
            candidates.update(alt_ops.low_rank(base, ranks, init=init))
            if "dws" in wanted:
                candidates["dws"] = alt_ops.depthwise_separable(base)
            if "k1" in wanted:
                candidates["k1"] = alt_ops.kernel_one(base)
        if block.kind == "opaque":
            candidates.clear()  # kept exactly as it is: no skip, no merge
            wanted = set()
        if "skip" in wanted:
            same = block.in_shape == block.out_shape
            candidates["skip"] = (None, "identity") if same else (None, "input and output shapes differ")
        nxt = plan.blocks[p + 1] if p + 1 < len(plan.blocks) else None
        if "merge" in wanted:
            fits = nxt is not None and nxt.kind != "opaque" and nxt.in_shape == nxt.out_shape
            if nxt is not None and fits and plan.stages[p + 1] == plan.stages[p]:
                candidates["merge"] = (alt_ops.merged(base), f"stands in for this block and {nxt.owner or 'the next'}")
            else:
                candidates["merge"] = (None, "the next block changes the shape, starts another stage or is opaque")
        example = torch.randn(1, *block.in_shape[1:])
        alts: dict[str, nn.Module] = {}
        choices = ["base"]
        for choice in CHOICE_ORDER[1:]:
            if choice not in candidates:
                continue
            module, note = candidates[choice]
            if choice == "skip":
                if note == "identity":
                    choices.append(choice)
                report.notes[choice] = note
                continue
            if module is None:
                report.notes[choice] = "not offered: " + note
                continue
            problem = _shape_problem(module, example, tuple(block.out_shape[1:]))
            if problem:
                report.notes[choice] = "not offered: " + problem
                continue
            alts[choice] = module
            choices.append(choice)
            report.notes[choice] = note
        report.choices = choices
        return tuple(choices), alts, report

    def _stream_widths(self, plan: ModelPlan, blocks: list[nn.Module], positions: list[BlockPosition],
                       levels: tuple[str, ...], init: bool) -> tuple[StreamWidths | None, str]:
        """Stream widths per stage, or None and why not."""
        if isinstance(self.stem, nn.Identity):
            return None, "no stream widths: the model has no stem to narrow the stream from"
        # Positions once a width slot heads every stage: block i moves down by its stage + 1.
        moved = {i: i + plan.stages[i] + 1 for i in range(len(blocks))}
        try:
            stream = StreamWidths(
                self.stem,
                {moved[i]: cast(fx.GraphModule, b.base) for i, b in enumerate(blocks)},
                self.exits[-1],
                {moved[i]: plan.stages[i] for i in range(len(blocks))},
                {s: levels for s in range(plan.num_stages)},
                {moved[i]: tuple(c for c in INNER_WIDTHS if c in positions[i].choices) for i in range(len(blocks))},
                init=init,
            )
        except StreamUnavailable as exc:
            return None, f"no stream widths: {exc}"
        return stream, f"stream widths {', '.join(levels)} in every stage"

    # -- the original path -------------------------------------------------------------

    def original_modules(self) -> list[nn.Module]:
        """Stem, every block's base and the final head: the user's model."""
        bases: list[nn.Module] = [block.base for block in self.blocks]  # type: ignore[misc]
        return [self.stem, *bases, self.exits[-1]]

    def set_original_frozen(self, frozen: bool) -> None:
        self.original_frozen = frozen
        for module in self.original_modules():
            for param in module.parameters():
                param.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True) -> ElastifiedSupernet:
        super().train(mode)
        if self.original_frozen:
            for module in self.original_modules():
                module.eval()  # dropout off: the original's outputs stay its eval outputs
        return self

    def base_parameters(self) -> Iterator[nn.Parameter]:
        seen: set[int] = set()
        for module in self.original_modules():
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param

    def elastic_parameters(self) -> list[nn.Parameter]:
        """Every block's alternatives and the stream widths' parents and private BNs."""
        params = [p for block in self.blocks for p in block.alts.parameters()]
        return params + (list(self.stream.parameters()) if self.stream is not None else [])

    def alternative_parameters(self) -> Iterator[nn.Parameter]:
        """Alternatives and the early exits: what elastification trains."""
        yield from self.elastic_parameters()
        for head in list(self.exits)[:-1]:
            yield from head.parameters()

    def prepare_alternatives(self) -> None:
        """Nothing to do: alternatives are initialised from the original when built."""

    # -- running -----------------------------------------------------------------------

    def _check(self, arch: ArchConfig) -> None:
        if arch.space_tag != self.space.tag:
            raise ModelError(f"arch {arch.arch_id} is for space {arch.space_tag}, this supernet is {self.space.tag}")

    def _stage_positions(self, stage: int) -> range:
        positions = [p for p, s in enumerate(self.stage_of) if s == stage]
        return range(positions[0], positions[-1] + 1)

    def forward_stage_features(self, x: torch.Tensor, arch: ArchConfig) -> list[torch.Tensor]:
        self._check(arch)
        widths = self.space.stage_widths(arch)
        h = self.stem(x) if widths[0] == "base" or self.stream is None else self.stream.stem_units[widths[0]](x)
        features = []
        in_w = widths[0]
        for s in range(arch.exit_stage + 1):
            h = self.entries[s](h)
            for p in self._stage_positions(s):
                if arch.choices[p] != NOT_EXECUTED and self.space.positions[p].kind != WIDTH_KIND:
                    h = self.run_block(p, h, arch.choices[p], in_w, widths[s])
                    in_w = widths[s]
            features.append(h)
        return features

    def run_block(self, p: int, h: torch.Tensor, choice: str, in_w: str = "base", out_w: str = "base"
                  ) -> torch.Tensor:
        """Block position ``p`` running ``choice`` on a stream of width ``in_w`` into ``out_w``."""
        if (in_w, out_w) == ("base", "base") or self.stream is None:
            return self.blocks[p](h, choice)
        return h if choice == "skip" else self.stream.unit(p, choice, in_w, out_w)(h)

    def run_exit(self, stage: int, h: torch.Tensor, width: str = "base") -> torch.Tensor:
        """Exit ``stage``'s head on the stream at ``width``."""
        if width == "base" or self.stream is None:
            return self.exits[stage](h)
        if stage == len(self.exits) - 1:
            return self.stream.head_units[width](h)
        return exit_forward(self.exits[stage], h, self.stream.index(self._stage_positions(stage)[-1], width))

    def forward_exits(self, x: torch.Tensor, arch: ArchConfig, detach_early: bool = False) -> list[torch.Tensor]:
        """Every exit's logits up to ``arch``'s; ``detach_early`` feeds the early heads the
        features without their gradient (the heads learn, the blocks serve the last exit)."""
        feats = self.forward_stage_features(x, arch)
        widths = self.space.stage_widths(arch)
        last = len(feats) - 1
        return [self.run_exit(s, f.detach() if detach_early and s < last else f, widths[s])
                for s, f in enumerate(feats)]

    def forward(self, x: torch.Tensor, arch: ArchConfig | None = None) -> torch.Tensor:
        arch = arch or self.space.largest()
        feats = self.forward_stage_features(x, arch)
        return self.run_exit(arch.exit_stage, feats[-1], self.space.stage_widths(arch)[arch.exit_stage])

    # -- materialising and enumerating --------------------------------------------------

    def materialize(self, arch: ArchConfig | str) -> VariantModule:
        """A plain module for ``arch`` (an ArchConfig or an arch id), in eval mode."""
        return materialize_units(self, arch)

    def block_input_shapes(self) -> dict[str, tuple[int, ...]]:
        if self._input_shapes is None:
            shapes: dict[str, tuple[int, ...]] = {}
            was_training = self.training
            self.eval()
            with torch.no_grad():
                h = torch.zeros(1, *self.space.input_shape, device=next(self.parameters()).device)
                shapes["stem"] = tuple(h.shape[1:])
                h = self.stem(h)
                for s in range(self.space.num_stages):
                    shapes[f"s{s}.entry"] = tuple(h.shape[1:])
                    for p in self._stage_positions(s):
                        shapes[self.space.positions[p].name] = tuple(h.shape[1:])
                        h = self.blocks[p](h, "base")
                    shapes[f"exit{s}"] = tuple(h.shape[1:])
            self.train(was_training)
            self._input_shapes = shapes
        return self._input_shapes

    def iter_block_choices(self) -> Iterator[BlockChoiceRef]:
        """Every unit any variant can run, at its real input shape (stream widths in keys)."""
        from hmt.supernet.elastify.units import iter_units

        for unit, shape in iter_units(self):
            yield BlockChoiceRef(self.unit_name(unit), unit[2], self.unit_module(unit), shape)

    def unit_name(self, unit: tuple[str, int, str]) -> str:
        kind, index, _ = unit
        if kind == "block":
            return self.space.positions[index].name
        return {"stem": "stem", "entry": f"s{index}.entry", "exit": f"exit{index}"}[kind]

    def variant_blocks(self, arch: ArchConfig) -> list[tuple[str, str]]:
        """(position, key) pairs ``arch`` executes, in order (its final exit only)."""
        units, _, exits = self.variant_units(arch)
        return [(self.unit_name(u), u[2]) for u in [*units, exits[arch.exit_stage]]]

    def stage_entries(self) -> tuple[bool, ...]:
        """Whether each stage starts with an entry unit (never: a cut model's stages are its blocks)."""
        return tuple(not isinstance(entry, nn.Identity) for entry in self.entries)

    def variant_units(
        self, arch: ArchConfig
    ) -> tuple[list[tuple[str, int, str]], dict[int, int], dict[int, tuple[str, int, str]]]:
        """What pareto's prefix evaluation runs (``Supernet.variant_units``): the units in
        order, {stage: units done when it ends}, every stage's exit unit."""
        from hmt.supernet.elastify.units import variant_units

        self._check(arch)
        return variant_units(self, arch)

    def unit_module(self, unit: tuple[str, int, str]) -> nn.Module:
        from hmt.supernet.elastify.units import unit_module

        return unit_module(self, unit)

    def report(self) -> dict[str, Any]:
        """The elastification report: stem, head, every block with its choices and notes."""
        offered = sum(len(r.choices) > 1 for r in self.reports)
        return {
            "stem_modules": self.stem_modules,
            "head_modules": self.head_modules,
            "num_stages": self.space.num_stages,
            "blocks": [r.__dict__ for r in self.reports],
            "blocks_elastified": offered,
            "blocks_kept": len(self.reports) - offered,
            "space_size": self.space.size(),
            "stream_widths": self.stream_note or "not asked for (operators sw75, sw50, sw25)",
        }


def _with_width_slots(blocks: list[nn.Module], positions: list[BlockPosition], plan: ModelPlan,
                      levels: tuple[str, ...]) -> tuple[list[nn.Module], list[BlockPosition]]:
    """A stream-width position (and its WidthSlot) at the head of every stage."""
    out_blocks: list[nn.Module] = []
    out_positions: list[BlockPosition] = []
    for i, (block, pos) in enumerate(zip(blocks, positions, strict=True)):
        if i == 0 or plan.stages[i] != plan.stages[i - 1]:
            s = plan.stages[i]
            last = max(q for q in range(len(blocks)) if plan.stages[q] == s)
            channels = positions[last].out_channels
            out_positions.append(BlockPosition(name=f"s{s}.width", stage=s, index=-1, kind=WIDTH_KIND,
                                               in_channels=channels, out_channels=channels, stride=1,
                                               choices=("base", *levels)))
            out_blocks.append(WidthSlot())
        out_blocks.append(block)
        out_positions.append(pos)
    return out_blocks, out_positions


@torch.no_grad()
def _shape_problem(module: nn.Module, example: torch.Tensor, expected: tuple[int, ...]) -> str | None:
    module.eval()
    try:
        out = module(example)
    except Exception as exc:  # noqa: BLE001 - any failure just means "not offered", with the reason
        return f"fails on the block's input ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    if tuple(out.shape[1:]) != expected:
        return f"gives shape {tuple(out.shape[1:])}, the block gives {expected}"
    return None


@torch.no_grad()
def largest_error(net: ElastifiedSupernet, model: nn.Module, *, seed: int, batch: int = 4) -> float:
    """Max abs difference between the largest variant and ``model`` on seeded random
    inputs, both in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *net.space.input_shape, generator=generator)
    device = next(net.parameters()).device
    was_training = net.training
    net.eval()
    model.eval()
    try:
        ours = net(x.to(device), net.space.largest()).float().cpu()
        theirs = model.to(device)(x.to(device)).float().cpu()
    finally:
        net.train(was_training)
    return float((ours - theirs).abs().max())
