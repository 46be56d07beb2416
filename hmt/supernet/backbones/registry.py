"""Backbone registry and the shared rules that decide each block's operator choices."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn

from hmt.errors import UsageError
from hmt.supernet.blocks import BlockSpec

ALL_OPERATORS = ("w75", "w50", "w25", "lr50", "lr25", "dws", "fire", "k1", "ghost", "skip", "merge")
# Stream (stage output) widths: opt-in, named in ``operators`` (sw75 -> a stage may run at
# 75% of its output channels). Only ResNet-style backbones (basic blocks) take them.
STREAM_OPERATORS = {"sw75": "w75", "sw50": "w50", "sw25": "w25"}
# Operators each block kind can take; the rest make no sense for that structure.
KIND_OPERATORS = {
    "basic": ALL_OPERATORS,
    "inverted": ("w75", "w50", "w25", "ghost", "skip"),
    "plain": ("lr50", "lr25", "dws", "fire", "k1", "ghost", "skip"),
}


@dataclass
class StageDef:
    blocks: list[BlockSpec]
    entry: Callable[[], nn.Module] | None = None  # e.g. VGG's max-pool before the stage


@dataclass
class BackboneDef:
    name: str
    dims: int
    input_shape: tuple[int, ...]
    num_classes: int
    stem: Callable[[], nn.Module]
    stem_channels: int
    stages: list[StageDef]
    head: Callable[[], nn.Module]
    pretrained_mapping: Callable[[dict], dict] | None = None
    notes: dict[str, str] = field(default_factory=dict)
    stream_widths: tuple[str, ...] = ()  # e.g. ("base", "w75", "w50"): the stage-width choices


BuilderFn = Callable[..., BackboneDef]
BACKBONES: dict[str, BuilderFn] = {}


def register_backbone(name: str) -> Callable[[BuilderFn], BuilderFn]:
    def wrap(fn: BuilderFn) -> BuilderFn:
        BACKBONES[name] = fn
        return fn

    return wrap


def build_backbone_def(
    name: str, *, num_classes: int, input_shape: Sequence[int], operators: Sequence[str] | None = None
) -> BackboneDef:
    if name not in BACKBONES:
        raise UsageError(f"unknown backbone {name!r}; known: {', '.join(sorted(BACKBONES))}")
    allowed = tuple(operators) if operators is not None else ALL_OPERATORS
    known = (*ALL_OPERATORS, *STREAM_OPERATORS)
    unknown = set(allowed) - set(known)
    if unknown:
        raise UsageError(f"unknown operators {sorted(unknown)}; known: {', '.join(known)}")
    stream = tuple(STREAM_OPERATORS[op] for op in STREAM_OPERATORS if op in allowed)
    block_ops = tuple(op for op in allowed if op not in STREAM_OPERATORS)
    definition = BACKBONES[name](num_classes=num_classes, input_shape=tuple(input_shape), operators=block_ops)
    if not stream:
        return definition
    if any(spec.kind != "basic" for stage in definition.stages for spec in stage.blocks):
        raise UsageError(f"stream widths ({', '.join(o for o in STREAM_OPERATORS if o in allowed)}) need a "
                         f"ResNet-style backbone of basic blocks; {name!r} has other block kinds")
    definition.stream_widths = ("base", *stream)
    for stage in definition.stages:
        stage.blocks = [dataclasses.replace(spec, stream_elastic=True) for spec in stage.blocks]
    return definition


def assign_choices(stages: list[list[dict]], operators: Sequence[str], dims: int, kernel: int = 3) -> list[StageDef]:
    """Turn raw block dicts into BlockSpecs with the choices each position admits.

    skip needs an identity shortcut (stride 1, in == out); merge needs the next block of
    the same stage to be skippable, since the merged block replaces both.
    """
    out: list[StageDef] = []
    for stage in stages:
        specs: list[BlockSpec] = []
        for i, raw in enumerate(stage):
            kind = raw["kind"]
            identity = raw["stride"] == 1 and raw["in"] == raw["out"]
            next_identity = (
                i + 1 < len(stage) and stage[i + 1]["stride"] == 1 and stage[i + 1]["in"] == stage[i + 1]["out"]
            )
            choices = ["base"]
            for op in KIND_OPERATORS[kind]:
                if op not in operators:
                    continue
                if op == "skip" and not identity:
                    continue
                if op == "merge" and not next_identity:
                    continue
                if op.startswith("w") and raw["mid"] == raw["in"] and kind == "inverted":
                    continue  # expand ratio 1: no hidden channels to slim
                choices.append(op)
            shortcut = raw.get("shortcut") or ("identity" if identity else "projection")
            specs.append(
                BlockSpec(
                    kind=kind,
                    in_channels=raw["in"],
                    out_channels=raw["out"],
                    mid_channels=raw["mid"],
                    stride=raw["stride"],
                    kernel=raw.get("kernel", kernel),
                    dims=dims,
                    shortcut=shortcut if (kind != "plain") else "none",
                    choices=tuple(choices),
                )
            )
        out.append(StageDef(blocks=specs))
    return out
