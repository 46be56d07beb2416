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

from hmt.errors import ModelError
from hmt.supernet.backbones import BackboneDef, build_backbone_def
from hmt.supernet.blocks import BLOCK_TYPES, keep_statistics
from hmt.supernet.exits import ExitHead
from hmt.supernet.space import NOT_EXECUTED, ArchConfig, BlockPosition, SearchSpace


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
    def __init__(self, definition: BackboneDef) -> None:
        super().__init__()
        self.definition = definition
        self.space = space_from_definition(definition)
        self.stem = definition.stem()
        self.entries = nn.ModuleList([(stage.entry() if stage.entry else nn.Identity()) for stage in definition.stages])
        self.blocks = nn.ModuleList(
            [BLOCK_TYPES[spec.kind](spec) for stage in definition.stages for spec in stage.blocks]
        )
        self.stage_of = [s for s, stage in enumerate(definition.stages) for _ in stage.blocks]
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

    def forward_stage_features(self, x: torch.Tensor, arch: ArchConfig) -> list[torch.Tensor]:
        """Features at the end of every stage up to the arch's exit."""
        self._check(arch)
        h = self.stem(x)
        features = []
        for s in range(arch.exit_stage + 1):
            h = self.entries[s](h)
            for p in self._stage_positions(s):
                choice = arch.choices[p]
                if choice != NOT_EXECUTED:
                    h = self.blocks[p](h, choice)
            features.append(h)
        return features

    def forward_exits(self, x: torch.Tensor, arch: ArchConfig) -> list[torch.Tensor]:
        feats = self.forward_stage_features(x, arch)
        return [self.exits[s](f) for s, f in enumerate(feats)]

    def forward(self, x: torch.Tensor, arch: ArchConfig) -> torch.Tensor:
        feats = self.forward_stage_features(x, arch)
        return self.exits[arch.exit_stage](feats[-1])

    def _stage_positions(self, stage: int) -> range:
        start = sum(len(st.blocks) for st in self.definition.stages[:stage])
        return range(start, start + len(self.definition.stages[stage].blocks))

    # -- preparing the elastic space ----------------------------------------------------

    def prepare_alternatives(self) -> None:
        """Rank channels by importance, then initialise every alternative from the base
        weights (SVD for low-rank, kernel centres, copies for merged blocks)."""
        for block in self.blocks:
            block.rank_channels()
            block.init_alternatives()

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
        for block in self.blocks:
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

    def materialize(self, arch: ArchConfig) -> VariantModule:
        """A plain module for ``arch`` with copies of only the chosen weights, in eval mode."""
        self._check(arch)
        segments: list[nn.Module] = []
        heads: list[nn.Module] = []
        for s in range(arch.exit_stage + 1):
            layers: list[nn.Module] = [keep_statistics(copy.deepcopy(self.stem))] if s == 0 else []
            if not isinstance(self.entries[s], nn.Identity):
                layers.append(keep_statistics(copy.deepcopy(self.entries[s])))
            for p in self._stage_positions(s):
                choice = arch.choices[p]
                if choice != NOT_EXECUTED:
                    layers.append(self.blocks[p].materialize(choice))
            segments.append(nn.Sequential(*layers))
            head = copy.deepcopy(self.exits[s])
            heads.append(keep_statistics(head) if s == len(self.exits) - 1 else head)
        variant = VariantModule(segments, heads, tuple(self.space.input_shape), arch.arch_id)
        # sliced copies (_copy_conv) are built on the CPU: keep the variant on the supernet's device
        return variant.to(next(self.parameters()).device).eval()

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
                        h = self.blocks[p](h, "base")
                    shapes[f"exit{s}"] = tuple(h.shape[1:])
            self.train(was_training)
            self._input_shapes = shapes
        return self._input_shapes

    def iter_block_choices(self) -> Iterator[BlockChoiceRef]:
        """Every (position, choice) as a plain eval-mode module at its real input shape."""
        shapes = self.block_input_shapes()
        yield BlockChoiceRef("stem", "base", copy.deepcopy(self.stem).eval(), shapes["stem"])
        for s in range(self.space.num_stages):
            if not isinstance(self.entries[s], nn.Identity):
                yield BlockChoiceRef(
                    f"s{s}.entry", "base", copy.deepcopy(self.entries[s]).eval(), shapes[f"s{s}.entry"]
                )
            for p in self._stage_positions(s):
                pos = self.space.positions[p]
                for choice in pos.choices:
                    module = self.blocks[p].materialize(choice).eval()
                    yield BlockChoiceRef(pos.name, choice, module, shapes[pos.name])
            yield BlockChoiceRef(f"exit{s}", "base", copy.deepcopy(self.exits[s]).eval(), shapes[f"exit{s}"])

    def variant_blocks(self, arch: ArchConfig) -> list[tuple[str, str]]:
        """(position, choice) pairs ``arch`` executes, in order (its final exit only)."""
        self._check(arch)
        out = [("stem", "base")]
        for s in range(arch.exit_stage + 1):
            if not isinstance(self.entries[s], nn.Identity):
                out.append((f"s{s}.entry", "base"))
            for p in self._stage_positions(s):
                if arch.choices[p] != NOT_EXECUTED:
                    out.append((self.space.positions[p].name, arch.choices[p]))
        out.append((f"exit{arch.exit_stage}", "base"))
        return out


def build_supernet(
    backbone: str, *, num_classes: int, input_shape: Sequence[int], operators: Sequence[str] | None = None
) -> Supernet:
    return Supernet(build_backbone_def(backbone, num_classes=num_classes, input_shape=input_shape, operators=operators))
