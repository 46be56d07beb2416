"""Roll-back protection for signed artifacts: never accept an older release of a key than one already served.

A signature binds a release version and the creation time (:mod:`hmt.artifacts.signing`).
A verifier that keeps, per trusted key, the newest ``(version, created_utc)`` it has
accepted refuses anything that sorts below it: an attacker who can replace a bundle with
an *older* one signed by the same key (with a known defect, or a worse model) no longer
gets it served. Releases compare by version first, then creation time, so bundles signed
without an explicit version (version 0) are ordered by when they were built. A
first-format signature (no version) is refused once a versioned release of the key has
been seen. Equal releases are accepted (the two offload halves of one bundle are one
release, and so is a bundle served twice).

The state is one small JSON file, by default ``$XDG_STATE_HOME/hmt/signed-releases.json``
(``~/.local/state/hmt/...`` when XDG_STATE_HOME is unset), or under ``$HMT_STATE_DIR`` or
an explicit directory; it is updated under an exclusive lock and written atomically
(temporary file, fsync, rename), so concurrent servers and a kill mid-write leave either
the old or the new state, never a torn one. A state file that cannot be parsed is an
error (refusing is safer than forgetting what was seen); the user can move it away.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hmt.artifacts.signing import SignatureCheck
from hmt.errors import ArtifactError, InputError

STATE_ENV = "HMT_STATE_DIR"
STATE_NAME = "signed-releases.json"
STATE_FORMAT = 1
_MAX_STATE_BYTES = 4 << 20


def default_state_dir() -> Path:
    """``$HMT_STATE_DIR``, else ``$XDG_STATE_HOME/hmt``, else ``~/.local/state/hmt``."""
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "hmt"


@dataclass(frozen=True)
class RollbackPolicy:
    """``allow``: accept older releases (serve --allow-rollback), still recording the newest seen."""

    state_dir: Path | None = None
    allow: bool = False

    @property
    def path(self) -> Path:
        return (self.state_dir if self.state_dir is not None else default_state_dir()) / STATE_NAME


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise InputError(f"{path.parent}: cannot create the roll-back state directory ({exc.strerror or exc}); "
                         "pass --state-dir DIR (a writable folder)") from exc
    try:
        try:
            import fcntl
        except ImportError:  # not POSIX: the atomic rename still keeps the file whole
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _MAX_STATE_BYTES:
            raise ArtifactError(f"{path}: larger than {_MAX_STATE_BYTES} bytes; not hmt's roll-back state")
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {"format": STATE_FORMAT, "keys": {}}
    except (OSError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: unreadable roll-back state ({type(exc).__name__}: {exc}); move it away to start "
                            "afresh (the releases it recorded are then forgotten)") from exc
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or not isinstance(doc.get("keys"), dict):
        raise ArtifactError(f"{path}: not hmt's roll-back state (format {STATE_FORMAT} with 'keys' expected)")
    for key, seen in doc["keys"].items():
        if not _is_release(seen):
            raise ArtifactError(f"{path}: the release recorded for key {str(key)[:16]}... is not a version (an "
                                "integer) and a creation time (a string); move the file away to start afresh (the "
                                "releases it recorded are then forgotten)")
    return doc


def _is_release(seen: Any) -> bool:
    """A recorded release compares as (version, created_utc): an int (or null) and a string (or null);
    anything else made the comparison raise TypeError (exit 70)."""
    if not isinstance(seen, dict):
        return False
    version, created = seen.get("version"), seen.get("created_utc")
    return (version is None or (isinstance(version, int) and not isinstance(version, bool))) and \
        (created is None or isinstance(created, str))


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Atomically; a state that cannot be written (a full or read-only disk) is refused naming it: serving
    a signed release unrecorded would let an older one in after it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(doc, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(path, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _unwritable(path: Path, exc: OSError) -> InputError:
    return InputError(f"{path}: cannot record the signed release served ({exc.strerror or exc}); free space "
                      "there or pass --state-dir DIR (a writable folder)")


def _release(version: int | None, created_utc: str | None) -> tuple[int, str]:
    return (-1 if version is None else version, created_utc or "")


def check_and_record(check: SignatureCheck, manifest_sha256: str, where: str,
                     policy: RollbackPolicy) -> dict[str, Any] | None:
    """Refuse (ArtifactError) a release of ``check.key_sha256`` older than the newest recorded, else record it.

    Only signatures checked against a trusted key count (``check.status == "ok"``); returns
    the previously recorded release of the key (None when none was)."""
    if check.status != "ok" or check.key_sha256 is None:
        return None
    path = policy.path
    with _locked(path):
        doc = _read(path)
        seen = doc["keys"].get(check.key_sha256)
        ours = _release(check.version, check.created_utc)
        if isinstance(seen, dict):
            theirs = _release(seen.get("version"), seen.get("created_utc"))
            if ours < theirs and not policy.allow:
                shown = "no version (a first-format signature)" if check.version is None else \
                    f"version {check.version}, created {check.created_utc}"
                raise ArtifactError(
                    f"{where}: roll-back refused: signed as {shown}, but this key's release version "
                    f"{seen.get('version')} created {seen.get('created_utc')} was already accepted "
                    f"(recorded in {path}); serve a newer bundle, or pass --allow-rollback")
            if ours <= theirs:
                return seen
        doc["keys"][check.key_sha256] = {"version": check.version, "created_utc": check.created_utc,
                                         "manifest_sha256": manifest_sha256,
                                         "recorded_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        _write(path, doc)
        return seen if isinstance(seen, dict) else None
