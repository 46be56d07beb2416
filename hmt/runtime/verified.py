"""Read a file an artifact lists, checked against the manifest's size and sha256 at every load.

``load_artifact`` checks every file once, when the artifact is opened; a long-running
server loads graphs again much later (a variant evicted under a memory cut and loaded
back). A graph changed on disk in between must be refused, not served (issue 17 item 3),
so each load hashes what it is about to load: ONNX graphs are hashed from the very bytes
handed to ONNX Runtime (nothing can change between the check and the load). Shared
libraries need a path for ``dlopen``, so :func:`private_copy` copies the bundle's file once
(one open descriptor) into a private folder (mode 0700, this process's own), hashing the
bytes as it copies them: what was hashed is the file that is loaded, and a file copied
over the bundle's library afterwards (or in between) changes neither what was checked nor
the mapping the process runs from (overwriting a mapped library in place crashed the
server with SIGBUS). The copy is removed once loaded (the mapping keeps it alive).
Hashing costs ~1 ms per MB, small next to building a session.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from hmt.artifacts import Artifact, safe_join
from hmt.artifacts.manifest import MANIFEST_NAME, FileRecord
from hmt.errors import ArtifactError, DeviceError

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


_PRIVATE_DIR: list[str] = []
_PRIVATE_LOCK = threading.Lock()


def _private_dir() -> str:
    """This process's own folder for library copies (mkdtemp: mode 0700), removed at exit."""
    with _PRIVATE_LOCK:
        if not _PRIVATE_DIR:
            folder = tempfile.mkdtemp(prefix="hmt-libs-")
            atexit.register(shutil.rmtree, folder, True)
            _PRIVATE_DIR.append(folder)
        return _PRIVATE_DIR[0]


def _copy_error(folder: Path, source: Path, exc: OSError) -> DeviceError:
    """A private copy that cannot be written (a full or read-only temporary folder) is this machine's
    problem, not the bundle's: name the folder and what to do."""
    return DeviceError(f"{folder}: cannot write the private copy of {source} that is loaded in its place "
                       f"({exc.strerror or exc}); free space there or point TMPDIR at another folder")


def _read_error(source: Path, exc: OSError) -> ArtifactError:
    return ArtifactError(f"{source}: cannot be read ({exc.strerror or exc})")


def _copy_hashed(source: Path, fd: int, copy: Path) -> tuple[int, str]:
    """Copy ``source`` into the open ``fd`` (the file ``copy``); (size, sha256). A read error names the
    bundle's file (ArtifactError), a write error the copy's folder (DeviceError)."""
    digest = hashlib.sha256()
    size = 0
    out = os.fdopen(fd, "wb")
    try:
        try:
            handle = open(source, "rb")  # noqa: SIM115 - the with below closes it; open errors name the file
        except OSError as exc:
            raise _read_error(source, exc) from exc
        with handle:
            while True:
                try:
                    chunk = handle.read(_CHUNK_BYTES)
                except OSError as exc:
                    raise _read_error(source, exc) from exc
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise _copy_error(copy.parent, source, exc) from exc
        try:
            out.close()  # flushes: a full disk may only say so here
        except OSError as exc:
            raise _copy_error(copy.parent, source, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            out.close()
    return size, digest.hexdigest()


@contextlib.contextmanager
def private_copy(artifact: Artifact, relative: str) -> Iterator[tuple[Path, str]]:
    """``(path, sha256)`` of a private copy of ``relative``, hashed while copied and matched with the
    manifest (ArtifactError otherwise); the copy is removed when the block ends (load it inside)."""
    record = _record(artifact, relative)
    source = safe_join(artifact.root, relative, what="manifest entry")
    suffix = "".join(source.suffixes[-1:])
    try:
        fd, name = tempfile.mkstemp(prefix="lib-", suffix=suffix, dir=_private_dir())
    except OSError as exc:
        raise _copy_error(Path(exc.filename or tempfile.gettempdir()), source, exc) from exc
    copy = Path(name)
    try:
        size, digest = _copy_hashed(source, fd, copy)
        _check(source, record, size, digest, artifact.root / MANIFEST_NAME)
        os.chmod(copy, 0o500)
        yield copy, record.sha256
    finally:
        copy.unlink(missing_ok=True)
