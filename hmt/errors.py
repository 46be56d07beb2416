"""Typed errors raised by every stage of hmt.

The CLI maps each class to an exit code in one place (``commands/app.py``); library code
raises these with a message that names the file or field at fault and what was expected.
"""

from __future__ import annotations

import errno
import zipfile
import zlib

# What numpy.load raises on a damaged or foreign .npz (not a zip, truncated, a bad CRC, a bad
# deflate stream, a member that is not .npy, a missing array, a header declaring an array larger
# than memory: numpy allocates it before reading a byte, so a 600-byte file asked for 10 PiB):
# the file is bad input, never a bug. OSError, ValueError and KeyError alone let a truncated copy
# through as an internal error (exit 70).
NPZ_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile,
                                               zlib.error, MemoryError)

# What a full, read-only or forbidden disk raises (OSError.errno): the user's environment, never a bug.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM})
# Of those, the ones only a write can raise.
WRITE_ONLY_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def storage_error_message(exc: OSError) -> str:
    """The one line for an OSError of :data:`STORAGE_ERRNOS`: the file(s) it names, then why."""
    where = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None) or "a file"
    return f"{where}: {exc.strerror}"


class HmtError(Exception):
    """Base of every error hmt raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UsageError(HmtError):
    """An option or argument is out of range or inconsistent with another."""

    exit_code = 2


class InputError(HmtError):
    """An input file or directory is missing, malformed or of the wrong shape."""

    exit_code = 3


class ArtifactError(HmtError):
    """An artifact failed verification: wrong kind, unknown schema, missing file, bad checksum."""

    exit_code = 4


class UnsafePathError(ArtifactError):
    """A path inside an artifact, archive or model points outside it."""


class ModelError(HmtError):
    """A model cannot be built, loaded, exported or compiled."""

    exit_code = 5


class VerificationError(HmtError):
    """A converted or compiled model does not match its reference within tolerance."""

    exit_code = 6


class DeviceError(HmtError):
    """A device, power monitor or runtime needed for the command is absent or failed."""

    exit_code = 7


class BudgetError(HmtError):
    """No candidate meets the requested budgets."""

    exit_code = 8
