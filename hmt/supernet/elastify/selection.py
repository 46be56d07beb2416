"""Which variants a specialization fine-tunes: ids given by the user, and/or the cheapest
variant within a margin of the largest, chosen on the validation split of a candidate table
(the supernet's ``variants.csv`` or a front CSV). The test split never chooses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hmt.errors import InputError, UsageError
from hmt.supernet.space import ArchConfig, SearchSpace

# Columns a candidate table must have: the validation accuracy chooses, the MACs rank by cost.
CANDIDATE_COLUMNS = ("arch_id", "val_acc", "macs")


SPECIALIZE_EXITS = ("joint", "detached")
MAX_TEACHERS = 8  # extra teachers of a specialization: each runs a forward pass every step


@dataclass(frozen=True)
class SpecializeRequest:
    """What ``hmt specialize`` was asked for (lr None: the parent's fine-tuning lr)."""

    variants: tuple[str, ...] = ()
    front_within: float | None = None
    candidates: str | None = None  # a CSV with CANDIDATE_COLUMNS; None: the parent's variants.csv
    epochs: int = 30
    lr: float | None = None
    data_path: str | None = None
    device: str = "auto"
    batch_size: int | None = None
    max_train_samples: int | None = None
    # "detached": the early exit heads learn on the blocks' features without moving them, so
    # every gradient on the path serves the variant's own exit, the one a deployment runs
    # (ResNet-18 width 0.5 from a 92 % original: +0.3 test / +0.7 validation points over
    # "joint"); "joint": their losses train the blocks too, as elastification's fine-tuning.
    exits: str = "detached"
    kd_temperature: float | None = None  # None: the parent's
    # Varies the order of the training images (0: the parent's); the split stays the parent's, so
    # runs with several seeds are compared on the same validation images.
    seed: int = 0
    # Weight files for the original's own architecture (other trainings of it, another seed say):
    # they teach beside the frozen original, the soft targets averaged over all of them.
    teachers: tuple[str, ...] = ()

    def validate(self) -> SpecializeRequest:
        if not self.variants and self.front_within is None:
            raise UsageError("nothing to specialize: give --variants ID[,ID...] and/or --front-within POINTS")
        if self.epochs < 1:
            raise UsageError(f"--epochs must be >= 1, got {self.epochs}")
        if self.lr is not None and not self.lr > 0:
            raise UsageError(f"--lr must be > 0, got {self.lr}")
        if self.front_within is not None and not 0 <= self.front_within <= 100:
            raise UsageError(f"--front-within must be a margin in accuracy points (0-100), got {self.front_within}")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise UsageError(f"--max-train-samples must be >= 1, got {self.max_train_samples}")
        if self.exits not in SPECIALIZE_EXITS:
            raise UsageError(f"--exits must be one of {', '.join(SPECIALIZE_EXITS)}, got {self.exits!r}")
        if not 0 <= self.seed < 2**31:
            raise UsageError(f"--seed must be in [0, 2**31), got {self.seed}")
        if self.kd_temperature is not None and not 0 < self.kd_temperature <= 100:
            raise UsageError(f"--kd-temperature must be in (0, 100], got {self.kd_temperature}")
        if len(self.teachers) > MAX_TEACHERS:
            raise UsageError(f"--teacher-weights: at most {MAX_TEACHERS} files (each runs every step), "
                             f"got {len(self.teachers)}")
        if len(set(self.teachers)) != len(self.teachers):
            raise UsageError("--teacher-weights: the same file is given twice")
        return self


@dataclass(frozen=True)
class Choice:
    arch: ArchConfig
    chosen_by: str  # how: "--variants", or the margin and the table it was chosen on

    def to_json_dict(self) -> dict[str, Any]:
        return {"arch_id": self.arch.arch_id, "chosen_by": self.chosen_by}


def parse_variant(space: SearchSpace, given: str) -> ArchConfig:
    """An arch id of ``space``; the space tag may be left out (``e3.555555555555``)."""
    text = given.strip()
    if not text:
        raise UsageError("--variants: an empty variant id; expected ids like e3.555555555555, comma-separated")
    try:
        return space.parse(space.with_tag(text))
    except UsageError as exc:
        raise UsageError(f"--variants {given}: not a variant of this supernet's space ({exc})") from exc


def select_variants(space: SearchSpace, request: SpecializeRequest, table: Any, table_name: str) -> list[Choice]:
    """The variants to specialize, in the order given, each once; never the largest (the
    original, which stays exact). ``table`` (a DataFrame) is read only for ``front_within``."""
    choices = [Choice(parse_variant(space, v), "--variants") for v in request.variants]
    if request.front_within is not None:
        choices.append(cheapest_within(space, table, table_name, request.front_within))
    largest = space.largest().arch_id
    out: list[Choice] = []
    for choice in choices:
        if choice.arch.arch_id == largest:
            raise UsageError(f"{choice.arch.arch_id} is the largest variant, the original, which stays exact; "
                             "specialize a smaller variant")
        if all(c.arch.arch_id != choice.arch.arch_id for c in out):
            out.append(choice)
    return out


def cheapest_within(space: SearchSpace, table: Any, table_name: str, points: float) -> Choice:
    """The variant with the fewest MACs whose validation accuracy is within ``points`` of the
    largest's (ties: the more accurate). Rows of another space are left out."""
    missing = [c for c in CANDIDATE_COLUMNS if c not in table.columns]
    if missing:
        raise InputError(f"{table_name}: no column {', '.join(missing)}; a candidate table needs "
                         f"{', '.join(CANDIDATE_COLUMNS)} (variants.csv or a front CSV)")
    rows = table[table.arch_id.astype(str).str.startswith(space.tag + ".")]
    largest = space.largest().arch_id
    reference = rows[rows.arch_id == largest]
    if reference.empty:
        raise InputError(f"{table_name}: no row for the largest variant {largest}, whose validation accuracy "
                         "the margin is measured from")
    floor = float(reference.val_acc.max()) - points / 100.0 - 1e-9
    within = rows[(rows.val_acc >= floor) & (rows.arch_id != largest)]
    if within.empty:
        raise UsageError(f"{table_name}: no variant is within {points:g} points of the largest "
                         f"({100 * float(reference.val_acc.max()):.2f}% on validation)")
    best = within.sort_values(["macs", "val_acc"], ascending=[True, False]).iloc[0]
    arch = space.parse(str(best.arch_id))
    return Choice(arch, f"--front-within {points:g}: the fewest MACs within {points:g} points of the largest on "
                        f"the validation split of {Path(table_name).name} ({100 * float(best.val_acc):.2f}%)")
