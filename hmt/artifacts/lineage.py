"""Finding an artifact's parents: by the path recorded relative to it, checked by manifest sha256.

A parent is recorded as its path relative to the child (``ArtifactWriter`` does it), so
moving the artifacts together keeps the lineage. Artifacts written before that recorded the
path as given on the command line (relative to the directory it ran in); that is tried too.
When neither holds the recorded manifest, the child's siblings are searched by sha256, so a
folder renamed beside the child is still found.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hmt.artifacts.manifest import MANIFEST_NAME, ParentRecord
from hmt.artifacts.store import Artifact, load_artifact
from hmt.errors import HmtError

# Siblings searched by sha256 at most (a parent folder of thousands of runs is not scanned).
MAX_SIBLINGS = 256


def _manifest_sha256(folder: Path) -> str | None:
    try:
        return hashlib.sha256((folder / MANIFEST_NAME).read_bytes()).hexdigest()
    except OSError:
        return None


def _candidates(child: Artifact, record: ParentRecord) -> list[Path]:
    recorded = Path(record.path)
    if recorded.is_absolute():
        return [recorded]
    return [child.root / recorded, recorded]


def find_parent(child: Artifact, record: ParentRecord, *, verify_checksums: bool = True) -> Artifact | None:
    """The parent ``record`` of ``child``, loaded and verified, or None when it cannot be found."""
    tried: set[str] = set()
    for candidate in _candidates(child, record):
        key = os.path.realpath(candidate)
        if key in tried:
            continue
        tried.add(key)
        if _manifest_sha256(candidate) == record.manifest_sha256:
            try:
                return load_artifact(candidate, kind=record.kind, verify_checksums=verify_checksums)
            except HmtError:
                return None
    try:
        siblings = sorted(p for p in child.root.parent.iterdir() if p.is_dir())[:MAX_SIBLINGS]
    except OSError:
        return None
    for sibling in siblings:
        if os.path.realpath(sibling) not in tried and _manifest_sha256(sibling) == record.manifest_sha256:
            try:
                return load_artifact(sibling, kind=record.kind, verify_checksums=verify_checksums)
            except HmtError:
                return None
    return None
