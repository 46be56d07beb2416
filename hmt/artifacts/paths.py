"""Path checks that keep references inside an artifact, archive or model directory."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from hmt.errors import UnsafePathError


def safe_join(root: Path, relative: str, *, what: str = "path") -> Path:
    """Join ``relative`` under ``root`` and refuse anything that would leave ``root``.

    Refused: absolute paths, ``..`` components, and symlinks (at any level) resolving
    outside ``root``. ``what`` names the reference in the error message.
    """
    if not relative or "\x00" in relative:
        raise UnsafePathError(f"{what} {relative!r} is empty or contains a NUL byte")
    pure = PurePosixPath(relative.replace("\\", "/"))
    if pure.is_absolute() or (len(relative) > 1 and relative[1] == ":"):
        raise UnsafePathError(f"{what} {relative!r} is absolute; expected a path inside {root}")
    if any(part == ".." for part in pure.parts):
        raise UnsafePathError(f"{what} {relative!r} contains '..'; expected a path inside {root}")
    root_resolved = Path(os.path.realpath(root))
    candidate = root_resolved.joinpath(*pure.parts)
    resolved = Path(os.path.realpath(candidate))
    if resolved != root_resolved and root_resolved not in resolved.parents:
        raise UnsafePathError(f"{what} {relative!r} resolves to {resolved}, outside {root_resolved}")
    return candidate
