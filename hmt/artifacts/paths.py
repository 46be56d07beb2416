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


def relative_to_artifact(path: str | os.PathLike[str], artifact_dir: str | os.PathLike[str]) -> str:
    """``path`` (absolute, or relative to the working directory) relative to ``artifact_dir``.

    What artifacts record of their inputs: never an absolute path of the machine that wrote
    them, and still found when the artifact moves together with its inputs.
    """
    where = os.path.relpath(os.path.abspath(path), os.path.abspath(artifact_dir))
    return PurePosixPath(*Path(where).parts).as_posix()


def resolve_recorded(recorded: str, artifact_dir: str | os.PathLike[str]) -> Path:
    """A path an artifact recorded with :func:`relative_to_artifact`, as a path here."""
    path = Path(recorded)
    return path if path.is_absolute() else Path(artifact_dir) / path
