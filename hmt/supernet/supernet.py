"""The supernet: stem, elastic blocks, one exit per stage; and its plain materialised variants.

Vocabulary (after Once-for-All): ``forward(x, arch)`` runs one architecture,
``forward_exits`` returns the logits of every exit up to the arch's exit, ``materialize``
returns a plain module with no unused branches, ``iter_block_choices`` enumerates every
(position, choice) for latency tables.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from hmt.errors import ModelError, UsageError
from hmt.supernet.backbones import BackboneDef, build_backbone_def
from hmt.supernet.block_types import BLOCK_TYPES
from hmt.supernet.blocks import SLIM_FULL, keep_statistics, width_channels
from hmt.supernet.exits import ExitHead
from hmt.supernet.slim import StreamWidthSlot, head_forward, seq_forward, slice_head, slice_seq
from hmt.supernet.space import (
    CHOICE_CODES,
    CODE_CHOICES,
    NOT_EXECUTED,
    STREAM_COMPATIBLE,
    WIDTH_KIND,
    ArchConfig,
    BlockPosition,
    SearchSpace,
)


@dataclass(frozen=True)
class BlockChoiceRef:
    position: str
    choice: str
    module: nn.Module
    input_shape: tuple[int, ...]


class VariantModule(nn.Module):
    """A materialised variant: segments (stem + stages up to the exit) and their exit heads.

    ``exit_heads[i]`` consumes ``segments[i]``'s output, so a runtime can stop after any
    segment; ``forward`` runs them all and returns the last exit's logits.
    """

    def __init__(
        self, segments: list[nn.Module], exit_heads: list[nn.Module], input_shape: tuple[int, ...], arch_id: str
    ) -> None:
        super().__init__()
        self.segments = nn.ModuleList(segments)
        self.exit_heads = nn.ModuleList(exit_heads)
        self.input_shape = input_shape
        self.arch_id = arch_id

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for segment in self.segments:
            x = segment(x)
        return self.exit_heads[-1](x)

    def forward_all(self, x: torch.Tensor) -> list[torch.Tensor]:
        logits = []
        for segment, head in zip(self.segments, self.exit_heads, strict=True):
            x = segment(x)
            logits.append(head(x))
        return logits


def space_from_definition(definition: BackboneDef) -> SearchSpace:
    positions = []
    for s, stage in enumerate(definition.stages):
        if definition.stream_widths:
            out_ch = stage.blocks[-1].out_channels if stage.blocks else definition.stem_channels
            positions.append(
                BlockPosition(
                    name=f"s{s}.width", stage=s, index=-1, kind=WIDTH_KIND, in_channels=out_ch,
                    out_channels=out_ch, stride=1, choices=definition.stream_widths,
                )
            )
        for i, spec in enumerate(stage.blocks):
            positions.append(
                BlockPosition(
                    name=f"s{s}.b{i}",
                    stage=s,
                    index=i,
                    kind=spec.kind,
                    in_channels=spec.in_channels,
                    out_channels=spec.out_channels,
                    stride=spec.stride,
                    choices=spec.choices,
                )
            )
    return SearchSpace(
        backbone=definition.name,
        num_classes=definition.num_classes,
        input_shape=tuple(definition.input_shape),
        num_stages=len(definition.stages),
        positions=tuple(positions),
    )


class Supernet(nn.Module):
    # A ``base`` choice runs the original's frozen modules only in the original variant; every
    # other variant runs the shared copies (``full``): hmt.runtime.blocks.ORIGINALS.
    original_units = "original-variant"

    def __init__(self, definition: BackboneDef) -> None:
        super().__init__()
        self.definition = definition
        self.space = space_from_definition(definition)
        self.stem = definition.stem()
        self.entries = nn.ModuleList([(stage.entry() if stage.entry else nn.Identity()) for stage in definition.stages])
        blocks: list[nn.Module] = []
        for stage in definition.stages:
            if definition.stream_widths:
                blocks.append(StreamWidthSlot())  # blocks[p] lines up with space.positions[p]
            blocks += [BLOCK_TYPES[spec.kind](spec) for spec in stage.blocks]
        self.blocks = nn.ModuleList(blocks)
        self.stage_of = [pos.stage for pos in self.space.positions]
        self._positions_of = [
            [p for p, pos in enumerate(self.space.positions) if pos.stage == s] for s in range(len(definition.stages))
        ]
        # Every variant but the original runs trainable copies of the stem, the blocks'
        # paths and the final head (Once-for-All style weight sharing among them); the
        # original's modules stay frozen and exact, and teach them.
        self.stem_w = definition.stem()
        self.head_w = definition.head()
        self.stream_channels = [
            stage.blocks[-1].out_channels if stage.blocks else definition.stem_channels for stage in definition.stages
        ]
        exits: list[nn.Module] = []
        for s, stage in enumerate(definition.stages):
            if s == len(definition.stages) - 1:
                exits.append(definition.head())
            else:
                out_ch = stage.blocks[-1].out_channels if stage.blocks else definition.stem_channels
                exits.append(ExitHead(definition.dims, out_ch, definition.num_classes))
        self.exits = nn.ModuleList(exits)
        self._input_shapes: dict[str, tuple[int, ...]] | None = None

    # -- running -----------------------------------------------------------------------

    def _check(self, arch: ArchConfig) -> None:
        if arch.space_tag != self.space.tag:
            raise ModelError(f"arch {arch.arch_id} is for space {arch.space_tag}, this supernet is {self.space.tag}")

    def channels(self, stage: int, width: str) -> int:
        """Channels of stage ``stage``'s stream at ``width``."""
        return width_channels(self.stream_channels[stage], width)

    def is_original(self, arch: ArchConfig) -> bool:
        """Whether ``arch`` runs the user's network (every executed choice ``base``, full
        streams; any exit): only then do the original's frozen modules run."""
        return all(c in ("base", NOT_EXECUTED) for c in arch.choices)

    def forward_stage_features(self, x: torch.Tensor, arch: ArchConfig) -> list[torch.Tensor]:
        """Features at the end of every stage up to the arch's exit."""
        self._check(arch)
        widths = self.space.stage_widths(arch)
        original = self.is_original(arch)
        if original:
            h = self.stem(x)
        elif widths[0] == "base":
            h = self.stem_w(x)
        else:
            h = seq_forward(self.stem_w, x, width_channels(self.definition.stem_channels, widths[0]))
        features = []
        stream = bool(self.definition.stream_widths)
        for s in range(arch.exit_stage + 1):
            h = self.entries[s](h)
            out_c = self.channels(s, widths[s])
            for p in self._stage_positions(s):
                choice = arch.choices[p]
                if choice == NOT_EXECUTED or self.space.positions[p].kind == WIDTH_KIND:
                    continue
                if choice == "base" and not original:
                    choice = SLIM_FULL
                h = self.blocks[p](h, choice, out_c) if stream else self.blocks[p](h, choice)
            features.append(h)
        return features

    def run_exit(self, stage: int, h: torch.Tensor, *, original: bool = True) -> torch.Tensor:
        """Exit ``stage``'s head on a full or slimmed stream; the final head is the
        original's only for the original network."""
        last = stage == len(self.exits) - 1
        if not last:
            full = h.shape[1] == self.stream_channels[stage]
            return self.exits[stage](h) if full else head_forward(self.exits[stage], h)
        if original:
            return self.exits[stage](h)
        return self.head_w(h) if h.shape[1] == self.stream_channels[stage] else head_forward(self.head_w, h)

    def forward_exits(self, x: torch.Tensor, arch: ArchConfig) -> list[torch.Tensor]:
        feats = self.forward_stage_features(x, arch)
        original = self.is_original(arch)
        return [self.run_exit(s, f, original=original) for s, f in enumerate(feats)]

    def forward(self, x: torch.Tensor, arch: ArchConfig) -> torch.Tensor:
        feats = self.forward_stage_features(x, arch)
        return self.run_exit(arch.exit_stage, feats[-1], original=self.is_original(arch))

    def _stage_positions(self, stage: int) -> list[int]:
        return self._positions_of[stage]

    # -- preparing the elastic space ----------------------------------------------------

    def prepare_alternatives(self) -> None:
        """Rank channels by importance, then initialise every alternative from the base
        weights (SVD for low-rank, kernel centres, copies for merged blocks)."""
        for block in self.blocks:
            block.rank_channels()
            block.init_alternatives()
        with torch.no_grad():
            self.stem_w.load_state_dict(self.stem.state_dict())
            self.head_w.load_state_dict(self.exits[len(self.exits) - 1].state_dict())

    def original_modules(self) -> list[nn.Module]:
        """The user's network inside the supernet: stem, entries, every block's own path
        and shortcut, and the final head. The largest variant runs exactly these."""
        mods: list[nn.Module] = [self.stem, *self.entries]
        for block in self.blocks:
            mods += block.original_modules()
        mods.append(self.exits[len(self.exits) - 1])
        return mods

    def base_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the original network (stem, base paths, shortcuts, final head)."""
        seen: set[int] = set()
        for module in self.original_modules():
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def alternative_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters only alternatives use: operators, the slim widths' copies and their
        private BNs (neither the original's nor the early exits')."""
        taken = {id(p) for p in self.base_parameters()}
        taken |= {id(p) for s in range(len(self.exits) - 1) for p in self.exits[s].parameters()}
        for block in [*self.blocks, self.stem_w, self.head_w]:
            for p in block.parameters():
                if id(p) not in taken:
                    taken.add(id(p))
                    yield p

    def original_state_keys(self) -> set[str]:
        """state_dict keys of the original network (parameters and BN buffers)."""
        ids = {id(t) for m in self.original_modules() for t in (*m.parameters(), *m.buffers())}
        named = dict(self.named_parameters()) | dict(self.named_buffers())
        return {k for k, t in named.items() if id(t) in ids}

    def freeze_original(self, frozen: bool = True) -> None:
        """Keep the user's network exact while alternatives train (AdaptiveNet): its
        parameters stop taking gradients and its BN layers stay in eval mode, so neither
        weights nor running statistics move. Undone by ``freeze_original(False)``."""
        self._original_frozen = frozen
        for module in self.original_modules():
            for p in module.parameters():
                p.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True) -> Supernet:
        super().train(mode)
        if mode and getattr(self, "_original_frozen", False):
            for module in self.original_modules():
                module.eval()
        return self

    def load_pretrained(self, path: Path) -> None:
        """Load the original network's weights (``torch.load(weights_only=True)``)."""
        if self.definition.pretrained_mapping is None:
            raise ModelError(f"backbone {self.definition.name} has no pretrained-weights mapping")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelError(f"{path}: cannot load as weights-only checkpoint ({exc})") from exc
        state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
        if not isinstance(state, dict):
            raise ModelError(f"{path}: expected a state dict or {{'state_dict': ...}}, got {type(blob).__name__}")
        mapped = self.definition.pretrained_mapping(state)
        # Mappings count blocks; with stream widths, positions interleave width slots.
        real = self.space.block_positions()
        mapped = {
            (f"blocks.{real[int(k.split('.')[1])]}." + k.split(".", 2)[2] if k.startswith("blocks.") else k): v
            for k, v in mapped.items()
        }
        last = len(self.exits) - 1
        mapped = {(k.replace("head_linear.", f"exits.{last}.linear.", 1)): v for k, v in mapped.items()}
        own = self.state_dict()
        unknown = sorted(k for k in mapped if k not in own)
        if unknown:
            raise ModelError(
                f"{path}: weights do not fit backbone {self.definition.name}: unexpected keys {unknown[:5]}"
            )
        bad = [
            f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}"
            for k, v in mapped.items()
            if own[k].shape != v.shape
        ]
        if bad:
            raise ModelError(f"{path}: weights do not fit backbone {self.definition.name}: {'; '.join(bad[:3])}")
        base_keys = self.original_state_keys()
        missing = sorted(k for k in base_keys - set(mapped) if not k.endswith("num_batches_tracked"))
        if missing:
            raise ModelError(f"{path}: weights do not fit backbone {self.definition.name}: missing keys {missing[:5]}")
        self.load_state_dict(mapped, strict=False)

    # -- materialising and enumerating --------------------------------------------------

    # -- units: what a variant runs, one module per (place, choice, stream widths) ---------

    def width_options(self, stage: int) -> tuple[str, ...]:
        """Stream widths stage ``stage`` may run at (``("base",)`` without stream widths)."""
        pos = next((self.space.positions[p] for p in self._positions_of[stage]
                    if self.space.positions[p].kind == WIDTH_KIND), None)
        return pos.choices if pos is not None else ("base",)

    def stage_entries(self) -> tuple[bool, ...]:
        """Whether each stage starts with an entry unit (a module before its first block)."""
        return tuple(not isinstance(entry, nn.Identity) for entry in self.entries)

    def variant_units(self, arch: ArchConfig) -> tuple[list[Unit], dict[int, int], dict[int, Unit]]:
        """The units ``arch`` runs in order, {stage: units done when it ends}, and each
        stage's exit unit. A unit is (kind, index, key); the key is the choice, plus the
        stream widths it reads and writes when they are not full (``w50/75``: inner w50,
        reading a 75% stream... as codes, e.g. ``w50/B7``)."""
        self._check(arch)
        widths = self.space.stage_widths(arch)
        base = "base" if self.is_original(arch) else SLIM_FULL  # the original, or the copies
        units: list[Unit] = [("stem", 0, unit_key(base, "base", widths[0]))]
        stage_end: dict[int, int] = {}
        exits: dict[int, Unit] = {}
        for s in range(arch.exit_stage + 1):
            previous = widths[s - 1] if s > 0 else widths[0]
            if not isinstance(self.entries[s], nn.Identity):
                units.append(("entry", s, unit_key("base", previous, previous)))
            for p in self._stage_positions(s):
                pos, choice = self.space.positions[p], arch.choices[p]
                if choice == NOT_EXECUTED or pos.kind == WIDTH_KIND:
                    continue
                in_w = previous if pos.index == 0 else widths[s]
                units.append(("block", p, unit_key(base if choice == "base" else choice, in_w, widths[s])))
            stage_end[s] = len(units)
            head = base if s == len(self.exits) - 1 else "base"  # early exits serve every variant
            exits[s] = ("exit", s, unit_key(head, widths[s], widths[s]))
        return units, stage_end, exits

    def unit_name(self, unit: Unit) -> str:
        kind, index, _ = unit
        if kind == "block":
            return self.space.positions[index].name
        return {"stem": "stem", "entry": f"s{index}.entry", "exit": f"exit{index}"}[kind]

    def unit_module(self, unit: Unit) -> nn.Module:
        """A plain eval-mode module for one unit (the original's BN layers marked to keep
        their statistics)."""
        kind, index, key = unit
        choice, in_w, out_w = parse_unit_key(key)
        if kind == "stem":
            if choice == "base":
                return keep_statistics(copy.deepcopy(self.stem)).eval()
            if out_w == "base":
                return copy.deepcopy(self.stem_w).eval()
            return slice_seq(self.stem_w, width_channels(self.definition.stem_channels, out_w)).eval()
        if kind == "entry":
            return keep_statistics(copy.deepcopy(self.entries[index])).eval()
        if kind == "exit":
            last = index == len(self.exits) - 1
            source = self.head_w if (last and choice == SLIM_FULL) else self.exits[index]
            if out_w == "base":
                head = copy.deepcopy(source)
                return (keep_statistics(head) if last and choice == "base" else head).eval()
            return slice_head(source, self.channels(index, out_w)).eval()
        block = self.blocks[index]
        if not self.definition.stream_widths:
            return block.materialize(choice).eval()
        spec = block.spec
        in_c, out_c = width_channels(spec.in_channels, in_w), width_channels(spec.out_channels, out_w)
        return block.materialize(choice, in_c, out_c).eval()

    def materialize(self, arch: ArchConfig | str) -> VariantModule:
        """A plain module for ``arch`` (an ArchConfig or an arch id) with copies of only the
        chosen weights, in eval mode."""
        return materialize_units(self, arch)

    def block_input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Input shape (no batch) of every position, traced once with the largest arch."""
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
                    h = self.entries[s](h)
                    for p in self._stage_positions(s):
                        shapes[self.space.positions[p].name] = tuple(h.shape[1:])
                        if self.space.positions[p].kind != WIDTH_KIND:
                            h = self.blocks[p](h, "base")
                    shapes[f"exit{s}"] = tuple(h.shape[1:])
            self.train(was_training)
            self._input_shapes = shapes
        return self._input_shapes

    def iter_block_choices(self) -> Iterator[BlockChoiceRef]:
        """Every unit any variant can run, as a plain eval-mode module at its real input
        shape: (position, key) with the stream widths in the key (``variant_blocks``)."""
        shapes = self.block_input_shapes()

        def ref(unit: Unit, shape: tuple[int, ...], channels: int) -> BlockChoiceRef:
            return BlockChoiceRef(self.unit_name(unit), unit[2], self.unit_module(unit), (channels, *shape[1:]))

        stem_shape = shapes["stem"]
        yield ref(("stem", 0, "base"), stem_shape, stem_shape[0])
        for w in self.width_options(0):
            yield ref(("stem", 0, unit_key(SLIM_FULL, "base", w)), stem_shape, stem_shape[0])
        for s in range(self.space.num_stages):
            previous = self.width_options(s - 1) if s > 0 else self.width_options(0)
            if not isinstance(self.entries[s], nn.Identity):
                shape = shapes[f"s{s}.entry"]
                for w in previous:
                    yield ref(("entry", s, unit_key("base", w, w)), shape, width_channels(shape[0], w))
            for p in self._stage_positions(s):
                pos = self.space.positions[p]
                if pos.kind == WIDTH_KIND:
                    continue
                shape = shapes[pos.name]
                yield ref(("block", p, "base"), shape, shape[0])
                for out_w in self.width_options(s):
                    for in_w in previous if (pos.index == 0 and s > 0) else (out_w,):
                        for choice in (SLIM_FULL, *(c for c in pos.choices if c != "base")):
                            if (in_w, out_w) != ("base", "base") and choice not in (SLIM_FULL, *STREAM_COMPATIBLE):
                                continue
                            unit = ("block", p, unit_key(choice, in_w, out_w))
                            yield ref(unit, shape, width_channels(shape[0], in_w))
            shape = shapes[f"exit{s}"]
            last = s == self.space.num_stages - 1
            if last:
                yield ref(("exit", s, "base"), shape, shape[0])
            for w in self.width_options(s):
                unit = ("exit", s, unit_key(SLIM_FULL if last else "base", w, w))
                yield ref(unit, shape, width_channels(shape[0], w))

    def variant_blocks(self, arch: ArchConfig) -> list[tuple[str, str]]:
        """(position, key) pairs ``arch`` executes, in order (its final exit only)."""
        units, _, exits = self.variant_units(arch)
        return [(self.unit_name(u), u[2]) for u in [*units, exits[arch.exit_stage]]]


Unit = tuple[str, int, str]


def materialize_units(net: nn.Module, arch: ArchConfig | str) -> VariantModule:
    """Assemble ``arch``'s variant (an ArchConfig, or an arch id parsed in ``net.space``) from
    ``net.variant_units`` / ``net.unit_module`` (any supernet with that pair: the built-in
    one, an elastified one)."""
    if isinstance(arch, str):
        arch = net.space.parse(arch)
    elif not isinstance(arch, ArchConfig):
        raise UsageError(f"materialize: expected an ArchConfig or an arch id string, got {type(arch).__name__}")
    units, stage_end, exits = net.variant_units(arch)
    segments: list[nn.Module] = []
    heads: list[nn.Module] = []
    begin = 0
    for s in range(arch.exit_stage + 1):
        segments.append(nn.Sequential(*[net.unit_module(u) for u in units[begin : stage_end[s]]]))
        heads.append(net.unit_module(exits[s]))
        begin = stage_end[s]
    variant = VariantModule(segments, heads, tuple(net.space.input_shape), arch.arch_id)
    # sliced copies (_copy_conv) are built on the CPU: keep the variant on the supernet's device
    return variant.to(next(net.parameters()).device).eval()


def unit_key(choice: str, in_width: str, out_width: str) -> str:
    """A unit's key: the choice alone on the full stream, else ``choice/<in><out>`` in codes."""
    if in_width == "base" and out_width == "base":
        return choice
    return f"{choice}/{CHOICE_CODES[in_width]}{CHOICE_CODES[out_width]}"


def parse_unit_key(key: str) -> tuple[str, str, str]:
    choice, _, widths = key.partition("/")
    if not widths:
        return choice, "base", "base"
    return choice, CODE_CHOICES[widths[0]], CODE_CHOICES[widths[1]]


def build_supernet(
    backbone: str, *, num_classes: int, input_shape: Sequence[int], operators: Sequence[str] | None = None
) -> Supernet:
    return Supernet(build_backbone_def(backbone, num_classes=num_classes, input_shape=input_shape, operators=operators))
