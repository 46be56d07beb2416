"""Atomic artifact writes and verified loads.

A stage builds its output in a temporary sibling directory, fsyncs every file, writes
the manifest last, then swaps the directory into place. A killed run leaves either the
previous artifact or the new one: if it dies between the two renames, the next write
or load finds the previous artifact under its backup name and puts it back.

Temporary names carry the writer's host and pid (``.<name>.hmt~<host>~<pid>~<random>``
+ ``.partial``/``.tmp``), so a later successful write of the same output can remove the
debris of killed writers (pid no longer running on this host) without touching the
temporary files of a writer that is still running.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from hmt import __version__
from hmt.artifacts.jsondoc import parse_json
from hmt.artifacts.manifest import (
    MANIFEST_NAME,
    FileRecord,
    Manifest,
    ParentRecord,
    environment_record,
    media_type_for,
)
from hmt.artifacts.outputs import check_output_dir, check_output_file
from hmt.artifacts.paths import safe_join
from hmt.artifacts.swap import (
    BACKUP_SUFFIX,
    fsync_dir,
    recover_interrupted_swap,
    recover_unlocked,
    remove_backup,
    shared_mode,
    swap_lock,
)
from hmt.errors import STORAGE_ERRNOS, WRITE_ONLY_ERRNOS, ArtifactError, InputError

_CHUNK_BYTES = 1 << 20
_TEMP_SUFFIXES = (".partial", ".tmp")
# Temporary names written before owner tags existed (8 random characters from tempfile)
# are removed only when this old: their writer cannot be identified, and a day is far
# longer than any stage.
LEGACY_STALE_AGE_S = 24 * 3600.0


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def temp_prefix(name: str) -> str:
    """Prefix of this process's temporary siblings of ``name`` (see :func:`clean_stale_temporaries`)."""
    return f".{name}.hmt~{_host_tag()}~{os.getpid()}~"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return True  # unknown: keep the files
    return True


def clean_stale_temporaries(parent: Path, name: str) -> list[Path]:
    """Remove ``.partial`` directories and ``.tmp`` files left in ``parent`` by killed writers of ``name``.

    Only names this module creates for ``name`` are considered. Tagged ones are removed when
    their host is this one and their pid is not running (this process's own are kept: a
    concurrent writer may be using them); untagged (older hmt) ones when older than
    :data:`LEGACY_STALE_AGE_S`. Returns what was removed; failures to remove are ignored
    (the next run tries again).
    """
    tagged = re.compile(rf"^\.{re.escape(name)}\.hmt~(?P<host>[A-Za-z0-9-]*)~(?P<pid>\d+)~[A-Za-z0-9_]+"
                        r"\.(?:partial|tmp)$")
    legacy = re.compile(rf"^\.{re.escape(name)}\.[a-z0-9_]{{8}}\.(?:partial|tmp)$")
    host, me, now = _host_tag(), os.getpid(), time.time()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.endswith(_TEMP_SUFFIXES):
            continue
        match = tagged.match(entry.name)
        if match is not None:
            pid = int(match["pid"])
            if match["host"] != host or pid == me or _pid_running(pid):
                continue
        elif legacy.match(entry.name) is not None:
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < LEGACY_STALE_AGE_S:
                    continue
            except OSError:
                continue
        else:
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write one file atomically (temp file in the same directory, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        shared_mode(tmp_name)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    clean_stale_temporaries(path.parent, path.name)


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
        return parse_json(path.read_bytes(), path)

    def as_parent(self) -> ParentRecord:
        return ParentRecord(kind=self.kind, path=str(self.root), manifest_sha256=self.manifest_sha256)


def load_artifact(path: Path | str, *, kind: str | Iterable[str], verify_checksums: bool = True) -> Artifact:
    """Load and verify an artifact directory.

    Refuses a missing directory or manifest, a wrong kind, an unknown schema version, a
    file listed but missing, a size or sha256 mismatch, and entries escaping the directory.
    """
    root = Path(path)
    recover_interrupted_swap(root)
    kinds = {kind} if isinstance(kind, str) else set(kind)
    manifest_path = root / MANIFEST_NAME
    if not root.is_dir():
        expected = " or ".join(sorted(kinds))
        if not os.path.lexists(root):
            raise InputError(f"{root}: does not exist; expected a {expected} artifact directory")
        raise InputError(f"{root}: is a file, not a directory; expected a {expected} artifact directory "
                         f"(a folder holding {MANIFEST_NAME})")
    if not manifest_path.is_file():
        raise ArtifactError(f"{manifest_path}: missing; {root} is not an hmt artifact")
    raw = manifest_path.read_bytes()
    data = parse_json(raw, manifest_path)
    manifest = Manifest.from_json_dict(data, source=str(manifest_path))
    if manifest.kind not in kinds:
        expected = " or ".join(sorted(kinds))
        raise ArtifactError(f"{manifest_path}: artifact kind is {manifest.kind!r}, expected {expected}")
    if verify_checksums:
        for record in manifest.files:
            file_path = safe_join(root, record.path, what="manifest entry")
            shown = root / record.path  # as the user gave the artifact (safe_join's path is resolved)
            if not file_path.is_file():
                raise ArtifactError(f"{shown}: listed in {manifest_path} but missing")
            size = file_path.stat().st_size
            if size != record.size_bytes:
                raise ArtifactError(
                    f"{shown}: size {size} bytes, manifest says {record.size_bytes}; the file was changed"
                )
            if sha256_file(file_path) != record.sha256:
                raise ArtifactError(f"{shown}: sha256 mismatch with {manifest_path}; the file was changed")
    return Artifact(root, manifest, hashlib.sha256(raw).hexdigest())


class ArtifactWriter:
    """Build an artifact in a temporary directory and swap it into place on success.

    Usage::

        with ArtifactWriter(out_dir, kind="supernet", config=cfg, parents=[parent]) as w:
            torch_save(w.path("weights.safetensors"))
            w.write_json("space.json", space)
            w.metrics["largest_top1"] = 0.91

    If the block raises, the temporary directory is removed and ``out_dir`` is untouched.
    An existing ``out_dir`` is replaced only as :func:`hmt.artifacts.outputs.check_output_dir`
    allows (an artifact of ``kind``, or of any kind with ``force``); ``inputs`` (and the roots of
    ``parents`` given as loaded artifacts) are never replaced nor written into. Parents are
    recorded relative to ``out_dir``, so the lineage survives moving the artifacts together.

    :meth:`before_commit` adds files that depend on the finished manifest (a signature);
    :meth:`companion` commits a file beside ``out_dir`` together with it (the deploy
    archive). A successful write then removes killed writers' temporaries of ``out_dir``.
    """

    def __init__(
        self,
        out_dir: Path | str,
        *,
        kind: str,
        config: dict[str, Any],
        parents: Iterable[Artifact | ParentRecord] = (),
        inputs: Iterable[Path | str] = (),
        force: bool = False,
        what: str = "--out",
    ) -> None:
        self.given = Path(out_dir)
        self.out_dir = Path(os.path.abspath(out_dir))
        self.kind = kind
        parents = tuple(parents)
        self.inputs = (*inputs, *(p.root for p in parents if isinstance(p, Artifact)))
        self.force = force
        self.what = what
        self.config = config
        self.parents = tuple(p.as_parent() if isinstance(p, Artifact) else p for p in parents)
        self.metrics: dict[str, Any] = {}
        self._tmp: Path | None = None
        self.manifest: Manifest | None = None
        self.manifest_sha256: str | None = None
        self._hooks: list[Callable[[Path, str], object]] = []
        self._companions: list[tuple[Path, Callable[[Path, Path], None]]] = []
        # Each committed companion's size (read before it was renamed: a later writer may replace it).
        self.companion_bytes: dict[Path, int] = {}

    def check_output(self) -> None:
        """Refuse the output path now, before any work (see :func:`check_output_dir`)."""
        check_output_dir(self.given, kind=self.kind, inputs=self.inputs, force=self.force, what=self.what)

    @property
    def tmp_dir(self) -> Path:
        if self._tmp is None:
            raise RuntimeError("ArtifactWriter used outside its 'with' block")
        return self._tmp

    def __enter__(self) -> ArtifactWriter:
        parent_dir = self.out_dir.parent
        recover_interrupted_swap(self.out_dir)
        self.check_output()
        try:
            parent_dir.mkdir(parents=True, exist_ok=True)
            self._tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(self.out_dir.name), suffix=".partial",
                                              dir=parent_dir))
        except OSError as exc:
            if exc.errno not in STORAGE_ERRNOS:
                raise
            raise InputError(f"{self.what} {self.given}: cannot be written ({exc.strerror})") from exc
        shared_mode(self._tmp, folder=True)
        return self

    def _write_failure(self, exc: BaseException | None, tmp: Path) -> InputError | None:
        """A full, read-only or forbidden destination (an OSError writing the artifact), as one error
        naming the output; None for anything else (reading an input, a bug)."""
        if not isinstance(exc, OSError) or exc.errno not in STORAGE_ERRNOS:
            return None
        if exc.errno not in WRITE_ONLY_ERRNOS:  # EACCES/EPERM: only where the artifact is written
            ours = (tmp, self.out_dir, *(path for path, _ in self._companions))
            names = [Path(os.path.abspath(str(n))) for n in (exc.filename, exc.filename2) if n is not None]
            if not any(name == place or place in name.parents for name in names for place in ours):
                return None
        return InputError(f"{self.what} {self.given}: cannot be written ({exc.strerror}); nothing was replaced, "
                          "and what was written of it is removed")

    def before_commit(self, hook: Callable[[Path, str], object]) -> None:
        """Call ``hook(tmp_dir, manifest_sha256)`` once the manifest is written, before anything is
        committed. Files it adds are not in the manifest (e.g. a signature over it)."""
        self._hooks.append(hook)

    def companion(self, path: Path | str, build: Callable[[Path, Path], None], *,
                  recognise: Callable[[Path], bool], description: str) -> None:
        """Commit the file ``path`` (outside the artifact) with the artifact.

        An existing ``path`` is replaced only if ``recognise(path)`` says it is one of hmt's
        (``description`` names what was expected in the refusal).

        ``build(tmp_dir, tmp_file)`` writes it from the finished artifact (after the
        :meth:`before_commit` hooks) into a temporary file. The previous ``path`` is removed
        before the directory swap and the new one renamed into place after it, so a kill at
        any point never leaves a ``path`` from another build beside ``out_dir``: at worst
        ``path`` is missing until the next successful run.
        """
        check_output_file(path, recognise=recognise, description=description, inputs=self.inputs,
                          what=f"{self.what} (beside it)")
        self._companions.append((Path(os.path.abspath(path)), build))

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
            failure = self._write_failure(exc, tmp)
            if failure is not None:
                raise failure from exc
            return
        staged: list[tuple[Path, Path]] = []
        try:
            self.manifest = Manifest(
                kind=self.kind,
                tool_version=__version__,
                created_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                config=self.config,
                parents=tuple(self._relative_parent(p) for p in self.parents),
                files=self._records(),
                environment=environment_record(),
                metrics=self.metrics,
            )
            raw = (json.dumps(self.manifest.to_json_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
            atomic_write_bytes(tmp / MANIFEST_NAME, raw)
            self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
            for hook in self._hooks:
                hook(tmp, self.manifest_sha256)
            fsync_dir(tmp)
            for path, build in self._companions:
                staged.append((path, self._stage_companion(path, build)))
            self._commit(staged)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            for _, staged_file in staged:
                staged_file.unlink(missing_ok=True)
            failure = self._write_failure(exc, tmp)
            if failure is not None:
                raise failure from exc
            raise
        finally:
            self._tmp = None
        clean_stale_temporaries(self.out_dir.parent, self.out_dir.name)
        for path, _ in staged:
            clean_stale_temporaries(path.parent, path.name)

    def _relative_parent(self, parent: ParentRecord) -> ParentRecord:
        """``parent`` with its path relative to this artifact (given relative to the working directory)."""
        if parent.path == "":
            return parent
        where = os.path.relpath(os.path.abspath(parent.path), self.out_dir)
        return ParentRecord(kind=parent.kind, path=Path(where).as_posix(), manifest_sha256=parent.manifest_sha256)

    def _stage_companion(self, path: Path, build: Callable[[Path, Path], None]) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
        os.close(fd)
        staged = Path(name)
        try:
            build(self.tmp_dir, staged)
            with open(staged, "rb") as handle:
                os.fsync(handle.fileno())
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        return staged

    def _commit(self, staged: list[tuple[Path, Path]]) -> None:
        with swap_lock(self.out_dir):  # one swap at a time into this folder (see _swap_lock)
            self._commit_locked(staged)

    def _commit_locked(self, staged: list[tuple[Path, Path]]) -> None:
        self.check_output()  # again: files may have been put there while this stage ran
        # Old companions go first: from here until the last rename, a kill leaves no
        # companion rather than one that belongs to another build than the directory.
        for path, _ in staged:
            path.unlink(missing_ok=True)
            fsync_dir(path.parent)
        tmp = self.tmp_dir
        backup = self.out_dir.with_name(self.out_dir.name + BACKUP_SUFFIX)
        recover_unlocked(self.out_dir)  # a backup left by a killed write must not block this one
        if backup.exists():
            raise ArtifactError(f"{backup}: in the way of replacing {self.out_dir} and not an artifact hmt moved "
                                "aside; move it away")
        if self.out_dir.exists():
            os.replace(self.out_dir, backup)
        os.replace(tmp, self.out_dir)
        fsync_dir(self.out_dir.parent)
        for path, staged_file in staged:
            self.companion_bytes[path] = staged_file.stat().st_size
            os.replace(staged_file, path)
            fsync_dir(path.parent)
        if backup.exists():
            remove_backup(backup)
