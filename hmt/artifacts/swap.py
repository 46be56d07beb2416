"""Swapping a finished artifact into place: the lock, the recovery of a killed swap, file modes.

A write builds the artifact in a temporary sibling and swaps it in with two renames (the previous
artifact aside as ``NAME.hmt-previous``, the new one into place); :func:`recover_interrupted_swap`
puts the previous one back when a kill came between them. :func:`swap_lock` serialises swaps and
recoveries into one folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from hmt.artifacts.manifest import MANIFEST_NAME

BACKUP_SUFFIX = ".hmt-previous"


def _umask() -> int:
    """The process's umask, read without changing it where Linux reports it (``/proc/self/status``)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (a plain file made meanwhile gets the common 022)
    os.umask(mask)
    return mask


def shared_mode(path: Path | str, *, folder: bool = False) -> None:
    """Give ``path`` the mode a plain ``mkdir``/``open`` gives (0777/0666 less the umask).

    ``tempfile`` makes its folders 0700 and its files 0600; an artifact built in one and renamed into
    place kept that mode, so a bundle copied to a device (``cp -r``, ``scp -r``) was unreadable by the
    service's own user."""
    os.chmod(path, (0o777 if folder else 0o666) & ~_umask())


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


@contextlib.contextmanager
def swap_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out_dir``'s parent folder (``flock`` on the folder itself: no lock
    file is left behind) while an artifact is swapped into it or an interrupted swap is put back.

    Two writers of one output, or a reader (``load_artifact``) beside a writer, otherwise interleaved
    their renames: a reader or writer "recovered" the backup another writer had just moved aside, the
    other's rename then failed, and both could exit 70 after one of them had committed."""
    try:
        import fcntl
    except ImportError:  # not POSIX: swaps are not serialised
        yield
        return
    try:
        fd = os.open(out_dir.parent, os.O_RDONLY)
    except OSError:  # no parent yet (nothing to recover), or not ours to open
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a filesystem without locks (some NFS): swap unserialised, as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def recover_interrupted_swap(out_dir: Path) -> None:
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to derive the backup's from
    with swap_lock(out_dir):
        recover_unlocked(out_dir)


def recover_unlocked(out_dir: Path) -> None:
    backup = out_dir.with_name(out_dir.name + BACKUP_SUFFIX)
    if backup.exists() and (backup / MANIFEST_NAME).is_file():  # only a previous artifact hmt moved aside
        if out_dir.exists():
            remove_backup(backup)
        else:
            os.replace(backup, out_dir)
    elif backup.is_dir() and not any(backup.iterdir()):  # a removal killed after its manifest went
        backup.rmdir()


def remove_backup(backup: Path) -> None:
    """Remove a previous artifact hmt moved aside, its manifest last: a kill part way leaves a
    folder that still says it is an artifact (so the next write removes it) or an empty one."""
    for root, dirs, files in os.walk(backup, topdown=False):
        for name in files:
            if not (Path(root) == backup and name == MANIFEST_NAME):
                Path(root, name).unlink(missing_ok=True)
        for name in dirs:
            shutil.rmtree(Path(root, name), ignore_errors=True)
    (backup / MANIFEST_NAME).unlink(missing_ok=True)
    backup.rmdir()
