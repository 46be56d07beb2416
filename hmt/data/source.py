"""What a reader hands to ``load_dataset``: the files to hash and how to decode them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hmt.data.types import Dataset
from hmt.progress import ProgressCallback


@dataclass(frozen=True)
class Source:
    """A located dataset source, not yet read.

    ``files`` are hashed into the cache key and ``info.source_sha256``; ``params`` are the
    reader settings that change the decoded arrays (feature recipe, split seed), so that
    changing one never serves a stale cache entry. ``decode(source_sha256, progress)``
    reads and checks every file and returns the dataset.
    """

    kind: str
    display: str
    files: list[tuple[str, Path]]
    decode: Callable[[str, ProgressCallback], Dataset]
    params: dict[str, Any] = field(default_factory=dict)
