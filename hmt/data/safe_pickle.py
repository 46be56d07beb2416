"""A restricted unpickler for the CIFAR-10 python batches.

The batches are pickled dicts (``b"data"``: uint8 array N x 3072, ``b"labels"``: list of
ints, ...). Pickle can run any callable it names, so only the few globals that numpy
needs to rebuild an array are resolved; anything else (``os.system``, ``eval``,
``subprocess.*`` ...) is refused before it is called.
"""

from __future__ import annotations

import builtins
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from hmt.errors import InputError


def _numpy_core() -> Any:
    # numpy 2 moved the array internals to numpy._core; pickles written by numpy 1.x
    # (and the 2009 CIFAR files) name numpy.core, which numpy 2 still serves with a warning.
    return getattr(np, "_core", None) or np.core


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    # Only the latin-1 form pickle itself writes; other codecs (zlib, bz2...) are refused.
    if not isinstance(text, str) or encoding.lower().replace("-", "") != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r}; only latin1 is allowed")
    return text.encode("latin-1")


def _allowed_globals() -> dict[tuple[str, str], Any]:
    core = _numpy_core()
    reconstruct = core.multiarray._reconstruct
    allowed: dict[tuple[str, str], Any] = {}
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
    for module in ("numpy.core.numeric", "numpy._core.numeric"):
        # Protocol-5 pickles of arrays rebuild them through _frombuffer (a plain copy).
        allowed[(module, "_frombuffer")] = core.numeric._frombuffer
    # Python 3 writes bytes at protocols 2 and below as _codecs.encode(text, "latin1").
    allowed[("_codecs", "encode")] = _latin1_encode
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    for name in ("dict", "list", "tuple", "bytes", "bytearray", "str", "int", "float", "bool"):
        for module in ("builtins", "__builtin__"):
            allowed[(module, name)] = getattr(builtins, name)
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals needed for dicts, lists and numpy arrays."""

    def __init__(self, file: io.BufferedIOBase, *, source: str) -> None:
        # encoding="bytes": the CIFAR files were written by Python 2; their str keys and
        # array buffers must come back as bytes, not be decoded as ASCII text.
        super().__init__(file, encoding="bytes")
        self._source = source
        self._allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise InputError(
                f"{self._source}: pickle refers to {module}.{name}; a CIFAR-10 batch may only hold "
                "dicts, lists, bytes, numbers and numpy arrays"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(f"{self._source}: pickle uses persistent ids; not a CIFAR-10 batch")


def safe_load_pickle(path: Path) -> Any:
    """Unpickle ``path`` allowing only plain containers and numpy arrays."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    try:
        return RestrictedUnpickler(io.BytesIO(data), source=str(path)).load()
    except InputError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise InputError(f"{path}: not a readable pickle ({type(exc).__name__}: {exc})") from exc
