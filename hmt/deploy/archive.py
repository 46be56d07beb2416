"""Deterministic ``.tar.gz`` of a bundle, and bounded, tar-slip-safe extraction.

Writing: ``manifest.json`` (and its signature) first, then the other entries sorted by
path, under one top-level folder, with fixed mtime/uid/gid/modes and no owner names;
gzip without a timestamp or file name, so equal bundle directories give byte-equal
archives. The manifest first lets extraction size its budget before any large entry.

Extraction: every entry must be a regular file or a directory with a relative path that
stays inside the destination; absolute paths, ``..``, symlinks, hardlinks, sparse files,
devices and FIFOs are refused (tar-slip) before anything is written. Sizes are bounded
(archive bombs) by a cap the archive cannot raise: :data:`PRE_MANIFEST_RATIO` times the
archive's own size plus a floor, and never more than ``max_total_bytes`` (the caller's)
or the free disk space. The manifest inside the archive can only tighten it (each file's
declared size must be the one it lists, the total at most :data:`BUDGET_FACTOR` times its
total): an attacker writes that manifest too, so a bomb listed in its own manifest is
still refused. The headers are checked as they are read, so an entry that would break the
budget is refused before its data is decompressed, and the bytes written are counted
again while writing.

Signatures before extraction (``trusted_key``): hmt writes ``manifest.json`` and its
``manifest.sig`` as the archive's first files, so the signature is checked against the
trusted key as soon as those two entries are read, before any other entry is looked at.
Then every other file must be one the signed manifest lists, with its listed size
(checked at its header) and sha256 (checked while it is written; a mismatch stops the
extraction and the caller's temporary folder goes). An unsigned archive, or one signed by
another key, is refused after reading at most its first two files. No detached signature
file is needed: the archive carries the bundle's own signature, which the extracted
directory keeps.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import lzma
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from hmt.artifacts.jsondoc import parse_json
from hmt.artifacts.manifest import MANIFEST_NAME, Manifest
from hmt.artifacts.paths import safe_join
from hmt.artifacts.signing import SIGNATURE_NAME, check_signature_bytes
from hmt.artifacts.store import clean_stale_temporaries, fsync_dir, temp_prefix
from hmt.errors import ArtifactError, HmtError, InputError, UnsafePathError

ARCHIVE_SUFFIX = ".tar.gz"
FIXED_MTIME = 0
_CHUNK_BYTES = 1 << 20
# The extracted total may be at most this multiple of what the manifest lists (plus
# _SLACK_BYTES for the manifest, signature and directory entries): a bundle archive holds
# exactly the listed files, so anything beyond is not a bundle hmt wrote.
BUDGET_FACTOR = 2
_SLACK_BYTES = 1 << 20
# Hard ceilings whatever the manifest claims (it is inside the archive, so an attacker
# writes it too): total bytes, number of entries, and the manifest's own size.
MAX_TOTAL_BYTES = 8 << 30
MAX_ENTRIES = 100_000
MAX_MANIFEST_BYTES = 16 << 20
MAX_SIGNATURE_BYTES = 64 << 10
# Until the manifest is read (hmt writes it first; a hand-made tar may not), entries may
# declare at most this multiple of the archive's own size, plus a floor: ONNX weights and
# shared libraries compress by 1-3x, a bomb of zeros by ~1000x.
PRE_MANIFEST_RATIO = 16
PRE_MANIFEST_FLOOR_BYTES = 64 << 20
# The most tarfile may read in one call: a PAX or GNU long-name header's data is read whole, at
# the size its header declares, before hmt sees the entry (a 300 kB gzip of one 300 MB PAX header
# took 370 MB of memory). Entries are read in 1 MiB chunks; the manifest in one read.
MAX_READ_BYTES = MAX_MANIFEST_BYTES + (1 << 20)


class _CappedReads:
    """The decompressed archive, refusing any single read over :data:`MAX_READ_BYTES`."""

    def __init__(self, stream: IO[bytes], archive: Path) -> None:
        self._stream = stream
        self._archive = archive

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > MAX_READ_BYTES:
            raise ArtifactError(f"{self._archive}: a tar header declares {size} bytes of metadata to read at once "
                                f"(a PAX or long-name header; at most {MAX_READ_BYTES}); refused before reading it "
                                "(an archive bomb, or not an archive hmt deploy wrote)")
        return self._stream.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


@contextlib.contextmanager
def _open_tar(archive: Path, mode: str = "r:*") -> Iterator[tarfile.TarFile]:
    """``archive`` (a tar, gzip, bzip2 or xz tar; ``r:gz``: gzip only) for reading, every read capped."""
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open(archive, "rb"))
        magic = raw.read(6)
        raw.seek(0)
        stream: Any = raw
        if magic.startswith(b"\x1f\x8b"):
            stream = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
        elif mode == "r:gz":
            raise tarfile.ReadError("not a gzip file")
        elif magic.startswith(b"BZh"):
            stream = stack.enter_context(bz2.BZ2File(raw))
        elif magic.startswith(b"\xfd7zXZ\x00"):
            stream = stack.enter_context(lzma.LZMAFile(raw))
        yield stack.enter_context(tarfile.open(fileobj=_CappedReads(stream, archive), mode="r:"))  # type: ignore[call-overload]


def archive_path_for(bundle_dir: Path) -> Path:
    """``<out>.tar.gz`` beside the bundle directory ``<out>``."""
    bundle_dir = Path(os.path.abspath(bundle_dir))
    return bundle_dir.with_name(bundle_dir.name + ARCHIVE_SUFFIX)


def is_archive(path: Path) -> bool:
    return path.is_file() and (path.name.endswith((".tar.gz", ".tgz", ".tar")))


def _tarinfo(name: str, *, size: int = 0, is_dir: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if is_dir:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.size = size
        info.mode = 0o644
    return info


def _entry_order(bundle_dir: Path) -> list[Path]:
    """Every path of the bundle, the manifest and its signature first, then sorted."""
    first = {MANIFEST_NAME: 0, SIGNATURE_NAME: 1}

    def key(path: Path) -> tuple[int, str]:
        rel = path.relative_to(bundle_dir).as_posix()
        return (first.get(rel, 2), rel)

    return sorted(bundle_dir.rglob("*"), key=key)


def write_archive_to(bundle_dir: Path, raw: IO[bytes], *, root_name: str | None = None) -> None:
    """Write ``bundle_dir`` as a deterministic ``.tar.gz`` into the open binary file ``raw``.

    Entries sit under one folder, ``root_name`` (default: the directory's name).
    """
    bundle_dir = Path(os.path.abspath(bundle_dir))
    root = root_name or bundle_dir.name
    # filename="" and mtime=0 keep the gzip header free of the temp name and the time.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=FIXED_MTIME, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo(root, is_dir=True))
        for path in _entry_order(bundle_dir):
            name = f"{root}/{path.relative_to(bundle_dir).as_posix()}"
            if path.is_symlink():
                raise UnsafePathError(f"{path}: symlinks are not allowed in a bundle")
            if path.is_dir():
                tar.addfile(_tarinfo(name, is_dir=True))
            elif path.is_file():
                with open(path, "rb") as handle:
                    tar.addfile(_tarinfo(name, size=path.stat().st_size), handle)


def write_archive(bundle_dir: Path, archive: Path | None = None, *, root_name: str | None = None) -> Path:
    """Write ``bundle_dir`` as a deterministic ``.tar.gz`` (atomically); returns its path.

    Entries sit under one folder named like the bundle directory (or ``root_name``).
    ``hmt deploy`` does not call this after the build: it commits the archive together with
    the directory (:meth:`hmt.artifacts.ArtifactWriter.companion`).
    """
    from hmt.artifacts.outputs import check_output_file

    bundle_dir = Path(os.path.abspath(bundle_dir))
    archive = archive_path_for(bundle_dir) if archive is None else Path(os.path.abspath(archive))
    check_output_file(archive, recognise=is_bundle_archive, description="an hmt bundle archive",
                      inputs=[bundle_dir], what="archive")
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(archive.name), suffix=".tmp", dir=archive.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            write_archive_to(bundle_dir, raw, root_name=root_name)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, archive)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(archive.parent)
    clean_stale_temporaries(archive.parent, archive.name)
    return archive


def build_archive_file(bundle_dir: Path, tmp_file: Path, *, root_name: str) -> None:
    """``ArtifactWriter.companion`` builder: the archive of the finished (temporary) bundle directory."""
    with open(tmp_file, "wb") as raw:
        write_archive_to(bundle_dir, raw, root_name=root_name)
    os.chmod(tmp_file, 0o644)


def _check_member(member: tarfile.TarInfo, archive: Path, dest: Path) -> PurePosixPath:
    """The entry's path relative to ``dest``; refuses links, special files and escaping names."""
    name = member.name
    where = f"{archive}: entry {name!r}"
    if member.issym() or member.islnk():
        raise UnsafePathError(f"{where} is a link (to {member.linkname!r}); refusing to extract it")
    if member.issparse():
        # A sparse entry expands to its "real size", far beyond the bytes it stores.
        raise UnsafePathError(f"{where} is a sparse file; refusing to extract it")
    if not (member.isfile() or member.isdir()):
        raise UnsafePathError(f"{where} is a device, FIFO or other special file; refusing to extract it")
    if "\\" in name:
        raise UnsafePathError(f"{where} has a backslash")
    target = safe_join(dest, name, what=f"{archive}: entry")
    return PurePosixPath(target.relative_to(dest).as_posix())


@dataclass
class _Budget:
    """What the archive may expand to, tightened once its manifest has been read."""

    archive: Path
    limit_bytes: int
    entries_limit: int = MAX_ENTRIES
    declared_bytes: int = 0
    entries: int = 0
    manifest_folder: PurePosixPath | None = None
    listed: dict[str, int] = field(default_factory=dict)
    seen: list[tuple[tarfile.TarInfo, PurePosixPath]] = field(default_factory=list)
    # With a trusted key: the signed manifest's sha256 of every file, and whether the signature was checked.
    strict: bool = False
    signed: bool = False
    listed_sha256: dict[str, str] = field(default_factory=dict)
    manifest_sha256: str = ""

    def add(self, member: tarfile.TarInfo, normal: PurePosixPath) -> None:
        self.entries += 1
        if self.entries > self.entries_limit:
            raise ArtifactError(f"{self.archive}: more than {self.entries_limit} entries; not a bundle archive "
                                "(refused before extracting)")
        if member.isfile():
            self.declared_bytes += member.size
            self._check_listed(member, normal)
        if self.declared_bytes > self.limit_bytes:
            raise ArtifactError(
                f"{self.archive}: entries declare {self.declared_bytes} bytes (at {member.name!r}), over the "
                f"extraction budget of {self.limit_bytes} bytes ({self._budget_reason()}); refused before "
                "extracting it (an archive bomb, or not an archive hmt deploy wrote)")
        self.seen.append((member, normal))

    def _budget_reason(self) -> str:
        if self.manifest_folder is None:
            return (f"no {MANIFEST_NAME} read yet: at most {PRE_MANIFEST_RATIO}x the archive's size + "
                    f"{PRE_MANIFEST_FLOOR_BYTES >> 20} MiB, and at most the hard limit")
        return (f"{BUDGET_FACTOR}x the {len(self.listed)} files {MANIFEST_NAME} lists, and at most "
                f"{PRE_MANIFEST_RATIO}x the archive's size + {PRE_MANIFEST_FLOOR_BYTES >> 20} MiB")

    def _check_listed(self, member: tarfile.TarInfo, normal: PurePosixPath) -> None:
        if self.manifest_folder is None:
            if self.strict:
                raise ArtifactError(f"{self.archive}: entry {member.name!r} comes before {MANIFEST_NAME}; a signed "
                                    f"archive starts with {MANIFEST_NAME} and {SIGNATURE_NAME} (hmt deploy writes "
                                    "them first); refused before extracting")
            return
        try:
            rel = normal.relative_to(self.manifest_folder).as_posix()
        except ValueError:
            if self.strict:
                raise ArtifactError(f"{self.archive}: entry {member.name!r} is outside the bundle folder; refused "
                                    "before extracting") from None
            return
        if self.strict and rel not in self.listed and rel not in (MANIFEST_NAME, SIGNATURE_NAME):
            raise ArtifactError(f"{self.archive}: entry {member.name!r} is not in the signed {MANIFEST_NAME}; "
                                "refused before extracting")
        expected = self.listed.get(rel)
        if expected is not None and member.size != expected:
            raise ArtifactError(f"{self.archive}: entry {member.name!r} declares {member.size} bytes, "
                                f"{MANIFEST_NAME} lists {expected}; refused before extracting")

    def read_manifest(self, tar: tarfile.TarFile, member: tarfile.TarInfo, normal: PurePosixPath,
                      max_total_bytes: int) -> None:
        where = f"{self.archive}: entry {member.name!r}"
        if member.size > MAX_MANIFEST_BYTES:
            raise ArtifactError(f"{where}: {member.size} bytes; a manifest is at most {MAX_MANIFEST_BYTES}")
        source = tar.extractfile(member)
        if source is None:
            raise InputError(f"{where} cannot be read")
        with source:
            raw = source.read(MAX_MANIFEST_BYTES + 1)
        manifest = Manifest.from_json_dict(parse_json(raw, where), source=where)
        try:
            listed = {str(f.path): int(f.size_bytes) for f in manifest.files}
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: a file size is not an integer ({exc})") from exc
        if any(size < 0 for size in listed.values()):
            raise ArtifactError(f"{where}: lists a negative file size")
        self.manifest_folder = normal.parent
        self.listed = listed
        self.listed_sha256 = {str(f.path): str(f.sha256) for f in manifest.files}
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        total = sum(listed.values()) + member.size
        # The manifest only tightens the cap set before it was read (it is the archive's own word).
        self.limit_bytes = min(self.limit_bytes, max_total_bytes, BUDGET_FACTOR * total + _SLACK_BYTES)
        # Files, their folders and a few extras (the signature): well under 3 per file.
        self.entries_limit = min(MAX_ENTRIES, 3 * len(listed) + 64)
        for seen_member, seen_normal in self.seen:
            if seen_member.isfile():
                self._check_listed(seen_member, seen_normal)
        if self.declared_bytes > self.limit_bytes or self.entries > self.entries_limit:
            raise ArtifactError(f"{self.archive}: entries before {MANIFEST_NAME} already exceed its budget "
                                f"({self.declared_bytes} bytes in {self.entries} entries, budget "
                                f"{self.limit_bytes} bytes in {self.entries_limit})")


    def check_signature(self, tar: tarfile.TarFile, member: tarfile.TarInfo, normal: PurePosixPath,
                        trusted_key: Any) -> None:
        """The entry right after the manifest must be its signature by ``trusted_key`` (before any other is read)."""
        where = f"{self.archive}: entry {member.name!r}"
        if self.manifest_folder is None or normal != self.manifest_folder / SIGNATURE_NAME:
            raise ArtifactError(f"{self.archive}: no {SIGNATURE_NAME} right after {MANIFEST_NAME} (found "
                                f"{member.name!r}); a trusted key was given, so the archive must be signed "
                                "(hmt deploy --sign-key); refused before extracting")
        if member.size > MAX_SIGNATURE_BYTES:
            raise ArtifactError(f"{where}: {member.size} bytes; a signature is at most {MAX_SIGNATURE_BYTES}")
        source = tar.extractfile(member)
        if source is None:
            raise InputError(f"{where} cannot be read")
        with source:
            raw = source.read(MAX_SIGNATURE_BYTES + 1)
        check_signature_bytes(raw, self.manifest_sha256, trusted_key, where)
        self.signed = True


def _is_manifest(normal: PurePosixPath) -> bool:
    # At the top, or in the single top-level folder write_archive uses.
    return normal.name == MANIFEST_NAME and len(normal.parts) <= 2


def _scan(tar: tarfile.TarFile, archive: Path, dest_real: Path, max_total_bytes: int,
          trusted_key: Any | None = None) -> _Budget:
    """Read and check every header (no data written), tightening the budget at the manifest and,
    with ``trusted_key``, checking the signature right after it."""
    cap = PRE_MANIFEST_RATIO * archive.stat().st_size + PRE_MANIFEST_FLOOR_BYTES
    budget = _Budget(archive, min(max_total_bytes, cap), strict=trusted_key is not None)
    paths: set[PurePosixPath] = set()
    while (member := tar.next()) is not None:
        normal = _check_member(member, archive, dest_real)
        if normal in paths and member.isfile():
            raise UnsafePathError(f"{archive}: entry {member.name!r} appears twice")
        paths.add(normal)
        if member.isfile() and budget.manifest_folder is None and _is_manifest(normal):
            budget.strict = False  # the manifest itself is what makes the listing known
            budget.add(member, normal)
            budget.strict = trusted_key is not None
            budget.read_manifest(tar, member, normal, max_total_bytes)
            continue
        if member.isfile() and budget.strict and not budget.signed:
            budget.check_signature(tar, member, normal, trusted_key)
        budget.add(member, normal)
    if budget.manifest_folder is None:
        raise ArtifactError(f"{archive}: no {MANIFEST_NAME} in the archive; not an hmt bundle")
    if budget.strict and not budget.signed:
        raise ArtifactError(f"{archive}: no {SIGNATURE_NAME}; a trusted key was given, so the archive must be signed "
                            "(hmt deploy --sign-key)")
    return budget


def _write_entries(tar: tarfile.TarFile, archive: Path, dest_real: Path, budget: _Budget) -> None:
    written = 0
    for member, normal in budget.seen:
        if not normal.parts:
            continue
        target = dest_real.joinpath(*normal.parts)
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        # Directories created above are real (links were refused), but check again:
        # nothing may resolve outside dest.
        safe_join(dest_real, normal.as_posix(), what=f"{archive}: entry")
        source = tar.extractfile(member)
        if source is None:
            raise InputError(f"{archive}: entry {member.name!r} cannot be read")
        entry_bytes = 0
        digest = hashlib.sha256()
        with source, open(target, "xb") as handle:
            while chunk := source.read(_CHUNK_BYTES):
                entry_bytes += len(chunk)
                written += len(chunk)
                # Counted again while writing: the headers were checked, the data is what lands on disk.
                if entry_bytes > member.size or written > budget.limit_bytes:
                    raise ArtifactError(f"{archive}: entry {member.name!r} expands past its declared size "
                                        f"or the budget of {budget.limit_bytes} bytes; extraction stopped")
                if budget.strict:
                    digest.update(chunk)
                handle.write(chunk)
        if budget.strict:
            _check_signed_digest(budget, member, normal, digest.hexdigest())


def _check_signed_digest(budget: _Budget, member: tarfile.TarInfo, normal: PurePosixPath, sha256: str) -> None:
    assert budget.manifest_folder is not None
    rel = normal.relative_to(budget.manifest_folder).as_posix()
    if rel == MANIFEST_NAME:
        expected = budget.manifest_sha256
    elif rel == SIGNATURE_NAME:
        return  # checked against the trusted key already
    else:
        expected = budget.listed_sha256.get(rel, "")
    if sha256 != expected:
        raise ArtifactError(f"{budget.archive}: entry {member.name!r} has sha256 {sha256[:16]}..., the signed "
                            f"{MANIFEST_NAME} lists {expected[:16]}...; extraction stopped")


def extract_archive(archive: Path, dest: Path, *, max_total_bytes: int = MAX_TOTAL_BYTES,
                    trusted_key: Any | None = None) -> Path:
    """Extract ``archive`` into the empty directory ``dest``; returns the bundle's root.

    Every header is checked (paths, types, sizes against the manifest and the budget)
    before anything is written, so a refused archive writes nothing; the bytes written
    are counted too, and extraction stops at the budget. With ``trusted_key`` (a loaded
    ed25519 public key) the signature is checked before any file but the manifest is read,
    and every file must match the signed manifest (module docstring). The root is the
    single top-level folder when there is one (how :func:`write_archive` writes), else ``dest``.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise InputError(f"{archive}: does not exist; expected a bundle archive (.tar.gz)")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with _open_tar(archive) as tar:
            dest_real = Path(os.path.realpath(dest))
            budget = _scan(tar, archive, dest_real, max_total_bytes, trusted_key)
            free = shutil.disk_usage(dest_real).free
            if budget.declared_bytes > free:
                raise InputError(f"{archive}: needs {budget.declared_bytes} bytes to extract, {dest} has "
                                 f"{free} free")
            _write_entries(tar, archive, dest_real, budget)
    except HmtError:
        raise
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError) as exc:
        # One line: tarfile's "r:*" lists every compression it tried, one per line.
        raise InputError(f"{archive}: not a readable tar archive ({' '.join(str(exc).split())})") from exc
    except OSError as exc:
        raise InputError(f"{archive}: cannot extract into {dest} ({exc})") from exc
    tops = {normal.parts[0] for _, normal in budget.seen if normal.parts}
    if len(tops) == 1:
        only = dest / next(iter(tops))
        if only.is_dir():
            return only
    return dest


def is_bundle_archive(path: Path) -> bool:
    """Whether ``path`` is an hmt bundle archive (as deploy writes it: a folder, then its
    ``manifest.json`` first); read from the start only, so a large archive costs nothing."""
    try:
        with _open_tar(path, mode="r:gz") as tar:
            first, second = tar.next(), tar.next()
    except (OSError, tarfile.TarError, EOFError, zlib.error, ArtifactError):
        return False
    if first is None or second is None or not first.isdir():
        return False
    return second.name == f"{first.name}/{MANIFEST_NAME}" and second.isfile()
