"""Decoded-array cache: decode a source once, reload it in a fraction of the time.

Each entry is one uncompressed ``.npz`` named by a key that hashes the reader's format
version, its parameters and the sha256 of the source files, so a changed source or a
changed reader never serves stale arrays. The entry carries its own metadata (the key
and a sha256 of every array) and is checked on load; a mismatch counts as a miss and
the entry is rebuilt. Writes go to a temporary file in the same directory, are fsynced
and renamed into place, so a killed run leaves the old entry or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from hmt.artifacts.store import fsync_dir, sha256_file

# Bump when the arrays a reader produces change meaning (layout, feature recipe, order).
CACHE_FORMAT_VERSION = 1
ENV_CACHE_ROOT = "HMT_CACHE_DIR"
_META_KEY = "__meta__"
_ARRAY_NAMES = ("train_x", "train_y", "test_x", "test_y")


def default_cache_dir() -> Path:
    """``$HMT_CACHE_DIR/data`` if the variable is set, else ``~/.cache/hmt/data``.

    The variable names hmt's cache root (other stages may keep caches beside this one).
    """
    root = os.environ.get(ENV_CACHE_ROOT)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "hmt") / "data"


def sha256_files(paths: list[tuple[str, Path]]) -> str:
    """One digest over several named files; a single file gets its plain sha256.

    The plain digest for one file lets it be compared with published checksums.
    """
    if len(paths) == 1:
        return sha256_file(paths[0][1])
    lines = "".join(f"{name}\t{sha256_file(path)}\n" for name, path in sorted(paths))
    return hashlib.sha256(lines.encode()).hexdigest()


def cache_key(kind: str, source_sha256: str, params: dict[str, Any]) -> str:
    blob = json.dumps(
        {"kind": kind, "format": CACHE_FORMAT_VERSION, "source": source_sha256, "params": params}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _array_digest(array: np.ndarray) -> str:
    # Hash the buffer in place: tobytes() would copy a 150 MB split just to digest it.
    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data).hexdigest()


def cache_path(cache_dir: Path, kind: str, key: str) -> Path:
    return cache_dir / f"{kind}-{key[:24]}-v{CACHE_FORMAT_VERSION}.npz"


def load_cached(path: Path, key: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays and info dict stored under ``key``, or None if absent or failing checks."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(npz[_META_KEY].tobytes().decode())
            arrays = {name: npz[name] for name in _ARRAY_NAMES}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError):
        warnings.warn(f"{path}: unreadable data cache entry, rebuilding it", RuntimeWarning, stacklevel=3)
        return None
    if meta.get("key") != key or meta.get("format") != CACHE_FORMAT_VERSION:
        return None
    digests = meta.get("sha256", {})
    for name, array in arrays.items():
        if digests.get(name) != _array_digest(array):
            warnings.warn(f"{path}: {name} fails its checksum, rebuilding the entry", RuntimeWarning, stacklevel=3)
            return None
    info = meta.get("info")
    if not isinstance(info, dict):
        return None
    return arrays, info


def store_cached(path: Path, key: str, arrays: dict[str, np.ndarray], info: dict[str, Any]) -> None:
    """Write an entry atomically. A cache that cannot be written only costs speed: warn."""
    meta = {
        "key": key,
        "format": CACHE_FORMAT_VERSION,
        "info": info,
        "sha256": {name: _array_digest(arrays[name]) for name in _ARRAY_NAMES},
    }
    payload: dict[str, Any] = {name: arrays[name] for name in _ARRAY_NAMES}
    payload[_META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp_name: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
        tmp_name = None
        fsync_dir(path.parent)
    except OSError as exc:
        warnings.warn(f"{path}: could not write the data cache ({exc})", RuntimeWarning, stacklevel=3)
    finally:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
