"""The wire format of an intermediate tensor between a device and its peer (no torch).

A segment request carries the tensor's raw bytes in the body and what is needed to read
them in headers, so the peer can check everything before it allocates anything:

- ``x-hmt-codec``: ``float32`` (as computed), ``float16`` (half the bytes; ~1e-3 relative
  error, below what changes an arg-max on the demo models) or ``int8`` (a quarter of the
  bytes; symmetric per-tensor quantisation with ``x-hmt-scale``, the largest magnitude / 127).
- ``x-hmt-shape``: comma-separated dimensions; the peer compares it with the cut's shape.
- ``x-hmt-scale``: int8 only, a number in (0, :data:`MAX_INT8_SCALE`].

The body must be exactly ``prod(shape) * itemsize`` bytes. Anything else is a
:class:`CodecError` (the peer answers 4xx and stays up).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

CODECS = ("float32", "float16", "int8")
CODEC_HEADER = "x-hmt-codec"
SHAPE_HEADER = "x-hmt-shape"
SCALE_HEADER = "x-hmt-scale"
_ITEMSIZE = {"float32": 4, "float16": 2, "int8": 1}
# int8 carries its scale in a header; count it so byte estimates match what is sent.
_INT8_SCALE_BYTES = 4
MAX_DIMS = 8
# 127 x the scale must stay a finite float32.
MAX_INT8_SCALE = float(np.finfo(np.float32).max) / 128.0


class CodecError(ValueError):
    """A tensor on the wire is malformed; ``status`` is the HTTP status the peer answers."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def wire_bytes(numel: int, codec: str) -> int:
    """Bytes on the wire for ``numel`` elements in ``codec`` (body, plus the scale for int8)."""
    if codec not in _ITEMSIZE:
        raise CodecError(f"codec {codec!r} is not one of {list(CODECS)}", 400)
    return numel * _ITEMSIZE[codec] + (_INT8_SCALE_BYTES if codec == "int8" else 0)


@dataclass(frozen=True)
class Encoded:
    body: bytes
    headers: dict[str, str]
    codec: str


def encode(x: np.ndarray, codec: str) -> Encoded:
    """``x`` (float32) as ``codec`` bytes plus the headers that describe them."""
    if codec not in CODECS:
        raise CodecError(f"codec {codec!r} is not one of {list(CODECS)}", 400)
    x = np.ascontiguousarray(x, dtype=np.float32)
    headers = {CODEC_HEADER: codec, SHAPE_HEADER: ",".join(str(d) for d in x.shape)}
    if codec == "float32":
        body = x.tobytes()
    elif codec == "float16":
        body = x.astype(np.float16).tobytes()
    else:
        peak = float(np.max(np.abs(x))) if x.size else 0.0
        scale = peak / 127.0 if peak > 0 and math.isfinite(peak) else 1.0
        body = np.clip(np.rint(x / scale), -127, 127).astype(np.int8).tobytes()
        headers[SCALE_HEADER] = repr(scale)
    return Encoded(body, headers, codec)


def _shape(text: str | None) -> tuple[int, ...]:
    if not text:
        raise CodecError(f"header {SHAPE_HEADER} is missing; expected comma-separated dimensions", 400)
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError as exc:
        raise CodecError(f"header {SHAPE_HEADER} {text[:64]!r} is not comma-separated integers", 400) from exc
    if not dims or len(dims) > MAX_DIMS or any(d < 1 for d in dims):
        raise CodecError(f"header {SHAPE_HEADER} {text[:64]!r}: expected 1..{MAX_DIMS} dimensions >= 1", 400)
    return dims


def decode(body: bytes, headers: Mapping[str, str], expected_shape: tuple[int, ...]) -> np.ndarray:
    """The float32 tensor in ``body``, checked against ``headers`` and ``expected_shape``."""
    codec = headers.get(CODEC_HEADER, "float32")
    if codec not in CODECS:
        raise CodecError(f"header {CODEC_HEADER} {codec[:32]!r} is not one of {list(CODECS)}", 400)
    shape = _shape(headers.get(SHAPE_HEADER))
    if shape != tuple(expected_shape):
        raise CodecError(f"tensor shape {list(shape)} does not match the cut's {list(expected_shape)}")
    numel = math.prod(shape)
    size = numel * _ITEMSIZE[codec]
    if len(body) != size:
        raise CodecError(f"body is {len(body)} bytes; a {codec} tensor of shape {list(shape)} is {size} bytes", 400)
    if codec == "float32":
        x = np.frombuffer(body, dtype=np.float32).reshape(shape)
    elif codec == "float16":
        x = np.frombuffer(body, dtype=np.float16).reshape(shape).astype(np.float32)
    else:
        text = headers.get(SCALE_HEADER)
        try:
            scale = float(text) if text is not None else math.nan
        except ValueError:
            scale = math.nan
        if not (math.isfinite(scale) and 0 < scale <= MAX_INT8_SCALE):
            raise CodecError(f"int8 tensor needs header {SCALE_HEADER} with a number in (0, {MAX_INT8_SCALE:.3g}] "
                             f"(127 x scale must be a finite float32), got {str(text)[:32]!r}", 400)
        x = np.frombuffer(body, dtype=np.int8).reshape(shape).astype(np.float32) * np.float32(scale)
    if not np.all(np.isfinite(x)):
        raise CodecError("tensor contains NaN or infinity")
    return np.ascontiguousarray(x)


def codec_times_ms(shape: tuple[int, ...], rng: np.random.Generator) -> dict[str, float]:
    """Median encode + decode time of a random tensor of ``shape`` in every codec (5 runs each)."""
    x = rng.standard_normal(shape).astype(np.float32)
    out = {}
    for codec in CODECS:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            enc = encode(x, codec)
            decode(enc.body, enc.headers, shape)
            times.append((time.perf_counter() - t0) * 1e3)
        out[codec] = float(np.median(times))
    return out
