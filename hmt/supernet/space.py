"""The search space as data: block positions, their operator choices, exits, and arch ids.

Pure Python (no torch) so that pareto and serve can parse ids and configs anywhere.

An architecture is one choice per block position plus the exit (the stage after which
the variant stops). Its id is short and stable::

    cres20-1a2b3c.e2.BB5LSFxG2

``cres20`` names the backbone, ``1a2b3c`` is a hash of the space definition (so an id is
never applied to a different space), ``e2`` the exit, then one character per block.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hmt.errors import UsageError

# Operator choices and their one-character codes. eta numbers follow CrowdHMTware.
CHOICE_CODES: dict[str, str] = {
    "base": "B",  # the original block
    "w75": "7",  # eta6: 75% of the block's inner channels (importance-ranked, shared weights)
    "w50": "5",
    "w25": "2",
    "lr50": "L",  # eta1: low-rank pair at 50% rank, SVD-initialised
    "lr25": "l",
    "dws": "D",  # eta1: depthwise-separable
    "fire": "F",  # eta2: squeeze 1x1 -> expand 1x1 + kxk
    "k1": "K",  # eta3: kernel-size option (1x1)
    "ghost": "G",  # eta4: primary conv for half the channels, cheap depthwise for the rest
    "skip": "S",  # eta5: skip a residual block
    "merge": "M",  # eta5: one block replacing this block and the next (AdaptiveNet merged block)
    "-": "x",  # not executed (after the exit, or covered by a merge)
}
CODE_CHOICES = {code: choice for choice, code in CHOICE_CODES.items()}
WIDTH_RATIOS = {"base": 1.0, "w75": 0.75, "w50": 0.5, "w25": 0.25}
NOT_EXECUTED = "-"
# A stage's stream width (eta6 on the stage's output channels: the residual stream, the
# stem or previous stage feeding it, its exit) is one more position of kind "width" at the
# head of the stage, so ids, JSON, sampling and the search treat it like any block choice.
WIDTH_KIND = "width"
# Blocks whose input or output stream is slimmed run one of these (the slim copy).
STREAM_COMPATIBLE = ("base", "w75", "w50", "w25", "skip")


@dataclass(frozen=True)
class BlockPosition:
    """One block slot of the backbone and the operators it may take."""

    name: str  # "s{stage}.b{index}"
    stage: int
    index: int
    kind: str  # "basic" | "inverted" | "plain"
    in_channels: int
    out_channels: int
    stride: int
    choices: tuple[str, ...]


@dataclass(frozen=True)
class ArchConfig:
    """One architecture of the space: a choice per position and the exit stage."""

    space_tag: str
    exit_stage: int
    choices: tuple[str, ...]

    @property
    def arch_id(self) -> str:
        return f"{self.space_tag}.e{self.exit_stage}." + "".join(CHOICE_CODES[c] for c in self.choices)

    def to_json_dict(self) -> dict[str, Any]:
        return {"arch_id": self.arch_id, "exit_stage": self.exit_stage, "choices": list(self.choices)}


@dataclass(frozen=True)
class SearchSpace:
    backbone: str
    num_classes: int
    input_shape: tuple[int, ...]
    num_stages: int
    positions: tuple[BlockPosition, ...]

    @property
    def fingerprint(self) -> str:
        payload = json.dumps(self.to_json_dict(), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:6]

    @property
    def tag(self) -> str:
        return f"{self.backbone}-{self.fingerprint}"

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "backbone": self.backbone,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            "num_stages": self.num_stages,
            "positions": [asdict(p) | {"choices": list(p.choices)} for p in self.positions],
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> SearchSpace:
        try:
            return cls(
                backbone=str(data["backbone"]),
                num_classes=int(data["num_classes"]),
                input_shape=tuple(int(v) for v in data["input_shape"]),
                num_stages=int(data["num_stages"]),
                positions=tuple(BlockPosition(**{**p, "choices": tuple(p["choices"])}) for p in data["positions"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"search space JSON is malformed ({exc})") from exc

    # -- building and checking configs -------------------------------------------------

    def make(self, choices: Sequence[str], exit_stage: int | None = None) -> ArchConfig:
        """Validate and canonicalise a config (positions past the exit become '-')."""
        exit_stage = self.num_stages - 1 if exit_stage is None else exit_stage
        if not 0 <= exit_stage < self.num_stages:
            raise UsageError(f"exit stage {exit_stage} out of range 0..{self.num_stages - 1}")
        if len(choices) != len(self.positions):
            raise UsageError(f"expected {len(self.positions)} block choices for {self.backbone}, got {len(choices)}")
        out: list[str] = []
        covered = False
        widths = self._stage_widths(choices)
        for pos, choice in zip(self.positions, choices, strict=True):
            if pos.stage > exit_stage:
                out.append(NOT_EXECUTED)
                continue
            if covered:
                out.append(NOT_EXECUTED)
                covered = False
                continue
            if choice not in pos.choices:
                raise UsageError(f"block {pos.name}: choice {choice!r} not in {list(pos.choices)}")
            if pos.kind != WIDTH_KIND and choice not in STREAM_COMPATIBLE and self._slim_stream(pos, widths):
                # Operators other than the widths are built for the full stream; on a slim
                # one the block runs its slim copy at full inner width (canonical form).
                choice = "base"
            out.append(choice)
            covered = choice == "merge"
        return ArchConfig(self.tag, exit_stage, tuple(out))

    def _stage_widths(self, choices: Sequence[str]) -> dict[int, str]:
        return {
            pos.stage: (c if c in WIDTH_RATIOS else "base")
            for pos, c in zip(self.positions, choices, strict=True)
            if pos.kind == WIDTH_KIND
        }

    @staticmethod
    def _slim_stream(pos: BlockPosition, widths: dict[int, str]) -> bool:
        """Whether block ``pos`` reads or writes a slimmed stream."""
        out_w = widths.get(pos.stage, "base")
        in_w = widths.get(pos.stage - 1, "base") if pos.index == 0 and pos.stage > 0 else out_w
        return out_w != "base" or in_w != "base"

    def stage_widths(self, arch: ArchConfig) -> list[str]:
        """The stream width of every stage (``base`` where the space has none)."""
        widths = self._stage_widths([c if c != NOT_EXECUTED else "base" for c in arch.choices])
        return [widths.get(s, "base") for s in range(self.num_stages)]

    @property
    def has_stream_widths(self) -> bool:
        return any(pos.kind == WIDTH_KIND for pos in self.positions)

    def block_positions(self) -> list[int]:
        """Indices of the real blocks (not the stream-width positions)."""
        return [i for i, pos in enumerate(self.positions) if pos.kind != WIDTH_KIND]

    def with_tag(self, arch_id: str) -> str:
        """``arch_id`` with this space's tag in front where it was left out (``e3.555555555555``)."""
        return f"{self.tag}.{arch_id}" if arch_id.count(".") == 1 and arch_id.startswith("e") else arch_id

    def resolve(self, given: str) -> ArchConfig:
        """What a user names a variant by: ``largest``, ``smallest``, or an arch id whose space
        tag may be left out (``e3.555555555555``, as ``hmt specialize`` takes it)."""
        if given == "largest":
            return self.largest()
        if given == "smallest":
            return self.smallest()
        return self.parse(self.with_tag(given))

    def parse(self, arch_id: str) -> ArchConfig:
        """Parse an arch id; refuses ids of another space or with unknown codes."""
        parts = arch_id.split(".")
        if len(parts) != 3 or not parts[1].startswith("e"):
            raise UsageError(f"arch id {arch_id!r} is not of the form <space>.e<exit>.<codes>")
        tag, exit_part, codes = parts
        if tag != self.tag:
            raise UsageError(f"arch id {arch_id!r} belongs to space {tag!r}, this supernet's space is {self.tag!r}")
        try:
            exit_stage = int(exit_part[1:])
            choices = [CODE_CHOICES[c] for c in codes]
        except (ValueError, KeyError) as exc:
            raise UsageError(f"arch id {arch_id!r}: bad exit or block code ({exc})") from exc
        # Positions written as '-' before the exit are kept so the merge coverage checks hold.
        config = self.make([c if c != NOT_EXECUTED else "base" for c in choices], exit_stage)
        if config.arch_id != arch_id:
            raise UsageError(f"arch id {arch_id!r} is not canonical; did you mean {config.arch_id!r}?")
        return config

    def from_json(self, data: dict[str, Any]) -> ArchConfig:
        if "arch_id" in data and "choices" not in data:
            return self.parse(str(data["arch_id"]))
        return self.make([str(c) if c != NOT_EXECUTED else "base" for c in data["choices"]], int(data["exit_stage"]))

    def largest(self) -> ArchConfig:
        return self.make(["base"] * len(self.positions))

    def smallest(self, exit_stage: int = 0) -> ArchConfig:
        """The cheapest config: exit 0 (or ``exit_stage``), and the cheapest choice of each block."""
        preference = ("skip", "w25", "lr25", "k1", "dws", "ghost", "fire", "w50", "lr50", "w75", "base")
        picks = []
        for pos in self.positions:
            picks.append(next((c for c in preference if c in pos.choices), "base"))
        return self.make(picks, exit_stage)

    def sample(self, rng: np.random.Generator, *, exit_stage: int | None = None) -> ArchConfig:
        """A uniformly random choice per block; a random exit unless one is given."""
        exit_stage = int(rng.integers(self.num_stages)) if exit_stage is None else exit_stage
        picks = [pos.choices[int(rng.integers(len(pos.choices)))] for pos in self.positions]
        return self.make(picks, exit_stage)

    def sample_structured(self, rng: np.random.Generator, *, exit_stage: int | None = None,
                          tied: bool = False) -> ArchConfig:
        """A width-level subnet: one stream width for every stream position and one inner
        width for every block (each drawn uniformly from the widths the space offers), and
        a random exit. Uniform per-block sampling almost never draws these, yet uniform
        slimming is where the fast, accurate variants of a front live (BigNAS samples
        per-stage widths for the same reason). ``tied`` draws one level for both (the
        width-multiplier networks: every channel count scaled alike)."""
        exit_stage = int(rng.integers(self.num_stages)) if exit_stage is None else exit_stage
        picks = []
        levels: dict[bool, str] = {}
        for pos in self.positions:
            stream = pos.kind == WIDTH_KIND
            if stream not in levels:
                widths = [c for c in WIDTH_RATIOS if c in pos.choices] or ["base"]
                if tied and levels:
                    levels[stream] = next(iter(levels.values()))
                else:
                    levels[stream] = widths[int(rng.integers(len(widths)))]
            picks.append(levels[stream] if levels[stream] in pos.choices else "base")
        return self.make(picks, exit_stage)

    def size(self) -> int:
        """Number of distinct (non-canonicalised) configs, for reporting."""
        total = 0
        for exit_stage in range(self.num_stages):
            count = 1
            for pos in self.positions:
                if pos.stage <= exit_stage:
                    count *= len(pos.choices)
            total += count
        return total
