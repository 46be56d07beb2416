"""Atomic artifact writes and verified loads.

A stage builds its output in a temporary sibling directory, fsyncs every file, writes
the manifest last, then swaps the directory into place. A killed run leaves either the
previous artifact or the new one: if it dies between the two renames, the next write
or load finds the previous artifact under its backup name and puts it back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from hmt import __version__
from hmt.artifacts.manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    ParentRecord,
    environment_record,
    media_type_for,
)
from hmt.artifacts.paths import safe_join
from hmt.errors import ArtifactError, InputError

_BACKUP_SUFFIX = ".hmt-previous"
_CHUNK_BYTES = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable; some filesystems refuse to fsync a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write one file atomically (temp file in the same directory, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _recover_interrupted_swap(out_dir: Path) -> None:
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to derive the backup's from
    backup = out_dir.with_name(out_dir.name + _BACKUP_SUFFIX)
    if backup.exists():
        if out_dir.exists():
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(backup, out_dir)


class Artifact:
    """A verified artifact directory: its manifest and checked access to its files."""

    def __init__(self, root: Path, manifest: Manifest, manifest_sha256: str) -> None:
        self.root = root
        self.manifest = manifest
        self.manifest_sha256 = manifest_sha256

    @property
    def kind(self) -> str:
        return self.manifest.kind

    def file(self, name: str) -> Path:
        """Path of a file the manifest lists; refuses names it does not list."""
        if not any(record.path == name for record in self.manifest.files):
            raise ArtifactError(f"{self.root / MANIFEST_NAME}: lists no file {name!r}")
        return safe_join(self.root, name, what="manifest entry")

    def read_json(self, name: str) -> Any:
        path = self.file(name)
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc

    def as_parent(self) -> ParentRecord:
        return ParentRecord(kind=self.kind, path=str(self.root), manifest_sha256=self.manifest_sha256)


def load_artifact(path: Path | str, *, kind: str | Iterable[str], verify_checksums: bool = True) -> Artifact:
    """Load and verify an artifact directory.

    Refuses a missing directory or manifest, a wrong kind, an unknown schema version, a
    file listed but missing, a size or sha256 mismatch, and entries escaping the directory.
    """
    root = Path(path)
    _recover_interrupted_swap(root)
    kinds = {kind} if isinstance(kind, str) else set(kind)
    manifest_path = root / MANIFEST_NAME
    if not root.is_dir():
        raise InputError(f"{root}: no such artifact directory")
    if not manifest_path.is_file():
        raise ArtifactError(f"{manifest_path}: missing; {root} is not an hmt artifact")
    raw = manifest_path.read_bytes()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{manifest_path}: not valid JSON ({exc})") from exc
    manifest = Manifest.from_json_dict(data, source=str(manifest_path))
    if manifest.kind not in kinds:
        expected = " or ".join(sorted(kinds))
        raise ArtifactError(f"{manifest_path}: artifact kind is {manifest.kind!r}, expected {expected}")
    if verify_checksums:
        for record in manifest.files:
            file_path = safe_join(root, record.path, what="manifest entry")
            if not file_path.is_file():
                raise ArtifactError(f"{file_path}: listed in {manifest_path} but missing")
            size = file_path.stat().st_size
            if size != record.size_bytes:
                raise ArtifactError(
                    f"{file_path}: size {size} bytes, manifest says {record.size_bytes}; the file was changed"
                )
            if sha256_file(file_path) != record.sha256:
                raise ArtifactError(f"{file_path}: sha256 mismatch with {manifest_path}; the file was changed")
    return Artifact(root, manifest, hashlib.sha256(raw).hexdigest())


class ArtifactWriter:
    """Build an artifact in a temporary directory and swap it into place on success.

    Usage::

        with ArtifactWriter(out_dir, kind="supernet", config=cfg, parents=[parent]) as w:
            torch_save(w.path("weights.safetensors"))
            w.write_json("space.json", space)
            w.metrics["largest_top1"] = 0.91

    If the block raises, the temporary directory is removed and ``out_dir`` is untouched.
    """

    def __init__(
        self,
        out_dir: Path | str,
        *,
        kind: str,
        config: dict[str, Any],
        parents: Iterable[Artifact | ParentRecord] = (),
    ) -> None:
        self.out_dir = Path(os.path.abspath(out_dir))
        self.kind = kind
        self.config = config
        self.parents = tuple(p.as_parent() if isinstance(p, Artifact) else p for p in parents)
        self.metrics: dict[str, Any] = {}
        self._tmp: Path | None = None
        self.manifest: Manifest | None = None

    @property
    def tmp_dir(self) -> Path:
        if self._tmp is None:
            raise RuntimeError("ArtifactWriter used outside its 'with' block")
        return self._tmp

    def __enter__(self) -> ArtifactWriter:
        parent_dir = self.out_dir.parent
        parent_dir.mkdir(parents=True, exist_ok=True)
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise InputError(f"{self.out_dir}: exists and is not a directory")
        _recover_interrupted_swap(self.out_dir)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", suffix=".partial", dir=parent_dir))
        return self

    def path(self, name: str) -> Path:
        """Path inside the new artifact for ``name`` (sub-folders are created)."""
        target = safe_join(self.tmp_dir, name, what="output name")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_bytes(self, name: str, data: bytes) -> Path:
        target = self.path(name)
        target.write_bytes(data)
        return target

    def write_json(self, name: str, obj: Any) -> Path:
        return self.write_bytes(name, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode())

    def _records(self) -> tuple[FileRecord, ...]:
        records = []
        for file_path in sorted(self.tmp_dir.rglob("*")):
            if file_path.is_symlink():
                raise ArtifactError(f"{file_path}: symlinks are not allowed inside an artifact")
            if not file_path.is_file() or file_path.name == MANIFEST_NAME:
                continue
            with open(file_path, "rb") as handle:
                os.fsync(handle.fileno())
            rel = file_path.relative_to(self.tmp_dir).as_posix()
            records.append(
                FileRecord(
                    path=rel,
                    sha256=sha256_file(file_path),
                    size_bytes=file_path.stat().st_size,
                    media_type=media_type_for(rel),
                )
            )
        return tuple(records)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tmp = self.tmp_dir
        if exc_type is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            self._tmp = None
            return
        try:
            self.manifest = Manifest(
                kind=self.kind,
                tool_version=__version__,
                created_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                config=self.config,
                parents=self.parents,
                files=self._records(),
                environment=environment_record(),
                metrics=self.metrics,
            )
            atomic_write_bytes(
                tmp / MANIFEST_NAME,
                (json.dumps(self.manifest.to_json_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n").encode(),
            )
            fsync_dir(tmp)
            backup = self.out_dir.with_name(self.out_dir.name + _BACKUP_SUFFIX)
            if self.out_dir.exists():
                os.replace(self.out_dir, backup)
            os.replace(tmp, self.out_dir)
            fsync_dir(self.out_dir.parent)
            shutil.rmtree(backup, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            self._tmp = None
