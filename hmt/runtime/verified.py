"""Read a file an artifact lists, checked against the manifest's size and sha256 at every load.

``load_artifact`` checks every file once, when the artifact is opened; a long-running
server loads graphs again much later (a variant evicted under a memory cut and loaded
back). A graph changed on disk in between must be refused, not served (issue 17 item 3),
so each load hashes what it is about to load: ONNX graphs are hashed from the very bytes
handed to ONNX Runtime (nothing can change between the check and the load); shared
libraries are hashed from their file just before ``dlopen`` (the loader needs a path).
Hashing costs ~1 ms per MB, small next to building a session.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hmt.artifacts import Artifact, safe_join
from hmt.artifacts.manifest import MANIFEST_NAME, FileRecord
from hmt.errors import ArtifactError

_CHUNK_BYTES = 1 << 20


def _record(artifact: Artifact, relative: str) -> FileRecord:
    for record in artifact.manifest.files:
        if record.path == relative:
            return record
    raise ArtifactError(f"{artifact.root / MANIFEST_NAME}: lists no file {relative!r}")


def _check(path: Path, record: FileRecord, size: int, digest: str, manifest: Path) -> None:
    if size != record.size_bytes:
        raise ArtifactError(f"{path}: size {size} bytes, {manifest} says {record.size_bytes}; "
                            "the file changed after the artifact was built, refused")
    if digest != record.sha256:
        raise ArtifactError(f"{path}: sha256 {digest[:12]}... does not match {manifest} "
                            f"({record.sha256[:12]}...); the file changed after the artifact was built, refused")


def read_verified(artifact: Artifact, relative: str) -> bytes:
    """The bytes of ``relative``, refused (ArtifactError) unless they match the manifest now."""
    record = _record(artifact, relative)
    path = safe_join(artifact.root, relative, what="manifest entry")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    _check(path, record, len(data), hashlib.sha256(data).hexdigest(), artifact.root / MANIFEST_NAME)
    return data


def verified_path(artifact: Artifact, relative: str) -> Path:
    """The path of ``relative`` after hashing the file now (for loaders that need a path)."""
    return verified_file(artifact, relative)[0]


def verified_file(artifact: Artifact, relative: str) -> tuple[Path, str]:
    """``(path, sha256)`` of ``relative`` after hashing the file now and matching the manifest."""
    record = _record(artifact, relative)
    path = safe_join(artifact.root, relative, what="manifest entry")
    digest = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    _check(path, record, size, digest.hexdigest(), artifact.root / MANIFEST_NAME)
    return path, record.sha256
