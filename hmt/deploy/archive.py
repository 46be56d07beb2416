"""Deterministic ``.tar.gz`` of a bundle, and extraction that refuses escaping entries.

Writing: entries sorted by path under one top-level folder, fixed mtime/uid/gid/modes and
no owner names, gzip without a timestamp or file name, so equal bundle directories give
byte-equal archives. Extraction: every entry must be a regular file or a directory with a
relative path that stays inside the destination; absolute paths, ``..``, symlinks,
hardlinks, devices and FIFOs are refused (tar-slip) before anything is written.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from hmt.artifacts.paths import safe_join
from hmt.artifacts.store import fsync_dir
from hmt.errors import InputError, UnsafePathError

ARCHIVE_SUFFIX = ".tar.gz"
FIXED_MTIME = 0
_CHUNK_BYTES = 1 << 20


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


def write_archive(bundle_dir: Path, archive: Path | None = None) -> Path:
    """Write ``bundle_dir`` as a deterministic ``.tar.gz`` (atomically); returns its path.

    Entries sit under one folder named like the bundle directory.
    """
    bundle_dir = Path(os.path.abspath(bundle_dir))
    archive = archive_path_for(bundle_dir) if archive is None else Path(os.path.abspath(archive))
    root = bundle_dir.name
    paths = sorted(bundle_dir.rglob("*"), key=lambda p: p.relative_to(bundle_dir).as_posix())
    fd, tmp_name = tempfile.mkstemp(prefix=f".{archive.name}.", suffix=".tmp", dir=archive.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            # filename="" and mtime=0 keep the gzip header free of the temp name and the time.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=FIXED_MTIME, compresslevel=9) as gz, \
                    tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_tarinfo(root, is_dir=True))
                for path in paths:
                    name = f"{root}/{path.relative_to(bundle_dir).as_posix()}"
                    if path.is_symlink():
                        raise UnsafePathError(f"{path}: symlinks are not allowed in a bundle")
                    if path.is_dir():
                        tar.addfile(_tarinfo(name, is_dir=True))
                    elif path.is_file():
                        with open(path, "rb") as handle:
                            tar.addfile(_tarinfo(name, size=path.stat().st_size), handle)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, archive)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(archive.parent)
    return archive


def _check_member(member: tarfile.TarInfo, archive: Path, dest: Path) -> PurePosixPath:
    """The entry's path relative to ``dest``; refuses links, special files and escaping names."""
    name = member.name
    where = f"{archive}: entry {name!r}"
    if member.issym() or member.islnk():
        raise UnsafePathError(f"{where} is a link (to {member.linkname!r}); refusing to extract it")
    if not (member.isfile() or member.isdir()):
        raise UnsafePathError(f"{where} is a device, FIFO or other special file; refusing to extract it")
    if "\\" in name:
        raise UnsafePathError(f"{where} has a backslash")
    target = safe_join(dest, name, what=f"{archive}: entry")
    return PurePosixPath(target.relative_to(dest).as_posix())


def extract_archive(archive: Path, dest: Path) -> Path:
    """Extract ``archive`` into the empty directory ``dest``; returns the bundle's root.

    Every entry is checked before any is written. The root is the single top-level
    folder when there is one (how :func:`write_archive` writes), else ``dest``.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise InputError(f"{archive}: no such archive")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = tar.getmembers()
            seen: set[PurePosixPath] = set()
            checked = []
            dest_real = Path(os.path.realpath(dest))
            for member in members:
                normal = _check_member(member, archive, dest_real)
                if normal in seen and member.isfile():
                    raise UnsafePathError(f"{archive}: entry {member.name!r} appears twice")
                seen.add(normal)
                checked.append((member, normal))
            for member, normal in checked:
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
                with source, open(target, "xb") as handle:
                    while chunk := source.read(_CHUNK_BYTES):
                        handle.write(chunk)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile) as exc:
        raise InputError(f"{archive}: not a readable tar archive ({exc})") from exc
    except OSError as exc:
        raise InputError(f"{archive}: cannot extract into {dest} ({exc})") from exc
    tops = {normal.parts[0] for _, normal in checked if normal.parts}
    if len(tops) == 1:
        only = dest / next(iter(tops))
        if only.is_dir():
            return only
    return dest
