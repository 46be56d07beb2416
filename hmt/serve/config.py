"""Build the serve stage's small config dataclasses from plain mappings (the serve config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from hmt.errors import UsageError

T = TypeVar("T")


def dataclass_from_mapping(cls: type[T], mapping: Mapping[str, Any], where: str) -> T:
    """``cls(**mapping)``, refusing unknown keys and wrong arguments with a UsageError naming ``where``."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(mapping) - names)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(names)}")
    try:
        return cls(**dict(mapping))
    except TypeError as exc:
        raise UsageError(f"{where}: {exc}") from exc
