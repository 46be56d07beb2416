"""Which variants a front may hold. A supernet trained with weight sharing offers its whole
space to the search. A specialized supernet (``hmt specialize``) does not: only the variants
its ``variants.csv`` lists were trained for themselves, and every other variant shares their
weights without having been trained for itself, so a search would put on the front variants
no deployment should run. There the front is made of the listed variants and their earlier
exits (method ``listed``), and the same method evaluates any user-given list (``--candidates``:
a ``variants.csv`` or a front CSV with an ``arch_id`` column)."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hmt.errors import InputError, UsageError
from hmt.pareto.records import SearchOptions
from hmt.supernet.space import SearchSpace

MAX_CANDIDATES = 10_000  # rows read from a candidate CSV (a listed run evaluates every one)


def is_specialized(manifest_config: Mapping[str, Any]) -> bool:
    """Whether a supernet artifact with this manifest config was written by ``hmt specialize``."""
    extra = manifest_config.get("extra") or {}
    return isinstance(extra, dict) and "specialize" in extra


def resolve_method(method: str, specialized: bool, candidates_path: Path | None) -> str:
    """Method ``auto`` as a run resolves it: ``listed`` for a specialized supernet or a candidate
    list, else ``nearby``; any other method as given."""
    if method != "auto":
        return method
    return "listed" if specialized or candidates_path is not None else "nearby"


def read_candidates(path: Path, space: SearchSpace) -> tuple[str, ...]:
    """The distinct arch ids of ``path``'s ``arch_id`` column, in file order. Rows of a
    quantised copy (``ID.int8``) stand for their fp32 variant; an id of another space, or not
    an id at all, is an error naming the file and the row."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or "arch_id" not in reader.fieldnames:
                raise InputError(f"{path}: no arch_id column; expected a variants.csv or a front CSV")
            ids: dict[str, None] = {}
            for row_number, row in enumerate(reader, start=2):
                if row_number > MAX_CANDIDATES + 1:
                    raise InputError(f"{path}: more than {MAX_CANDIDATES} rows; list the variants to evaluate")
                given = (row.get("arch_id") or "").strip()
                arch_id = ".".join(given.split(".")[:3])
                try:
                    space.parse(arch_id)
                except UsageError as exc:
                    raise InputError(f"{path}, row {row_number}: {exc}") from exc
                ids[arch_id] = None
    except FileNotFoundError as exc:
        raise InputError(f"{path}: does not exist; expected a CSV of variants (variants.csv or a front CSV)") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from exc
    if not ids:
        raise InputError(f"{path}: lists no variant")
    return tuple(ids)


def resolve_search(search: SearchOptions, loaded: Any,
                   candidates_path: Path | None) -> tuple[SearchOptions, str | None]:
    """``search`` with method ``auto`` resolved and the candidates of method ``listed`` read
    (from ``candidates_path``, else the supernet's own ``variants.csv``), and a note for the
    front's record when a specialized supernet is searched as a whole."""
    from hmt.supernet.artifact import VARIANTS

    specialized = is_specialized(loaded.artifact.manifest.config)
    # (--candidates with a searching method is refused by ParetoOptions.validate, before any work)
    method = resolve_method(search.method, specialized, candidates_path)
    if method != "listed":
        note = None
        if specialized:
            note = (f"{loaded.artifact.root.name} is a specialized supernet searched with --method {method}: only "
                    "the variants its variants.csv lists were trained for themselves")
        return replace(search, method=method), note
    if candidates_path is None:
        source = loaded.artifact.file(VARIANTS)
        ids = read_candidates(source, loaded.space)
        what = (f"the {len(ids)} variants {loaded.artifact.root.name} lists (its variants.csv: the largest and "
                "those it was specialized for) and their earlier exits; its other variants share their weights "
                "without having been trained for themselves")
    else:
        ids = read_candidates(Path(candidates_path), loaded.space)
        what = f"the {len(ids)} variants of {Path(candidates_path).name} and their earlier exits"
    return replace(search, method="listed", candidates=ids), f"the front is made of {what}"
