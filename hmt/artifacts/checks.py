"""Structural checks of a loaded artifact directory: exactly the listed files, nothing else.

``load_artifact`` proves every listed file is intact; these prove nothing unlisted rides
along (an extra ``.so`` a loader might pick up, a symlink to ``/etc``, a FIFO that blocks
a reader). Used by ``deploy --verify`` and by ``serve`` at start-up alike.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from hmt.artifacts.manifest import MANIFEST_NAME
from hmt.artifacts.store import Artifact
from hmt.errors import ArtifactError, UnsafePathError

# Error messages name at most this many paths, then how many more there are: a tampered
# directory with 50,000 extra files gives a readable one-line error, not 600 KB.
NAMES_IN_MESSAGE = 10


def bounded_names(names: Sequence[str], limit: int = NAMES_IN_MESSAGE) -> str:
    """``a, b, c`` or ``a, b, ... and 49,998 more`` (names in the order given)."""
    shown = ", ".join(names[:limit])
    rest = len(names) - limit
    return f"{shown} ... and {rest:,} more" if rest > 0 else shown


def check_exact_files(artifact: Artifact, *, allowed: Iterable[str] = ()) -> int:
    """Refuse symlinks, special files, unlisted files and missing files under ``artifact.root``.

    ``allowed`` names files that may be present without being listed (the manifest
    itself always is; e.g. its signature). Returns the number of listed files.
    """
    root = artifact.root
    listed = {record.path for record in artifact.manifest.files}
    free = {MANIFEST_NAME, *allowed}
    found: set[str] = set()
    extra: list[str] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        base = Path(folder)
        for name in sorted(dirs + files):
            path = base / name
            rel = path.relative_to(root).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise UnsafePathError(f"{path}: a symlink (to {os.readlink(path)!r}) inside the artifact; "
                                      "only regular files are allowed")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise UnsafePathError(f"{path}: a device, FIFO or socket inside the artifact; "
                                      "only regular files are allowed")
            if rel in listed:
                found.add(rel)
            elif rel not in free:
                extra.append(rel)
    if extra:
        raise ArtifactError(f"{root}: {len(extra):,} file(s) not in {MANIFEST_NAME}: {bounded_names(sorted(extra))}; "
                            "the artifact was changed")
    missing = sorted(listed - found)
    if missing:
        raise ArtifactError(f"{root}: {len(missing):,} file(s) listed in {MANIFEST_NAME} but missing: "
                            f"{bounded_names(missing)}")
    return len(listed)
