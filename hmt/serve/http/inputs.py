"""Decoding ``/v1/predict`` bodies into a batch of model inputs (torch-free; Pillow for images).

Accepted bodies (``Content-Type``):

- ``application/x-npy`` or ``application/octet-stream`` holding a ``.npy`` array:
  the model's tensor (the bundle's dtype, shape ``[C, H, W]``, ``[1, C, H, W]`` or a
  batch ``[N, C, H, W]``), or **uint8 pixels** ``[H, W, C]`` / ``[N, H, W, C]`` (grey: also
  ``[H, W]`` / ``[N, H, W]``) that the bundle's preprocessing normalises;
- ``application/json`` ``{"inputs": <nested list of numbers>}`` in the tensor's shape (or a
  batch of them). Only numbers: booleans, strings (even ``"1.5"``), ``null`` and
  non-finite values are refused; so are integers too long for float32 and nesting deeper
  than the parser's limit;
- ``image/jpeg`` or ``image/png``: one encoded image, decoded with Pillow, converted to
  the model's channels, resized to its input size when it differs, then normalised.

Preprocessing comes from ``bundle.json``'s optional ``preprocess`` (mean, std, layout,
pixel scale); without one, an image bundle gets CIFAR-10's (``hmt.bundle.Preprocess``).
Image and uint8 inputs need an image-shaped input (4-D, one mean per channel).

Decoded images are bounded before any pixel is decompressed: the header's width x height
must be at most ``max_pixels`` (a 1 MB PNG can declare gigapixels), and only the JPEG and
PNG decoders are enabled. Every refusal is an :class:`ApiError` with a 4xx status.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.bundle import SEQUENCE_LAYOUT, BundleSpec, Preprocess, TensorSpec
from hmt.serve.running.runner import numpy_dtype

NPY_MEDIA_TYPE = "application/x-npy"
_MAX_NPY_HEADER_BYTES = 10_000  # numpy's own default bound
OCTET_MEDIA_TYPE = "application/octet-stream"
JSON_MEDIA_TYPE = "application/json"
IMAGE_MEDIA_TYPES = {"image/jpeg": "JPEG", "image/png": "PNG"}
MEDIA_TYPES = (NPY_MEDIA_TYPE, OCTET_MEDIA_TYPE, JSON_MEDIA_TYPE, *IMAGE_MEDIA_TYPES)
# float32's largest finite value has 39 digits; a longer integer literal cannot be an input.
_MAX_INT_DIGITS = 39


class ApiError(Exception):
    """A refusal with an HTTP status, a stable code and a plain message for the client."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


@dataclass(frozen=True)
class InputSpec:
    """What ``/v1/predict`` accepts for one bundle."""

    tensor: TensorSpec
    preprocess: Preprocess | None  # None: the input is not an image (no image/uint8 bodies)
    max_batch: int = 64
    max_pixels: int = 4096 * 4096
    # A sequence input's per-channel standardization (bundle preprocess of layout NCL): raw values
    # sent as such (/v2 input "raw", /v1 JSON "raw") are standardized here. None: not a sequence.
    sequence: Preprocess | None = None

    @classmethod
    def of_bundle(cls, spec: BundleSpec, *, max_batch: int = 64, max_pixels: int = 4096 * 4096) -> InputSpec:
        shape = spec.input.shape
        if spec.preprocess is not None and spec.preprocess.layout == SEQUENCE_LAYOUT:
            fits = len(shape) == 3 and shape[1] == len(spec.preprocess.mean)
            return cls(spec.input, None, max_batch, max_pixels, spec.preprocess if fits else None)
        pre = spec.preprocess if spec.preprocess is not None else Preprocess()
        channels = None
        if len(shape) == 4:
            channels = shape[1] if pre.layout == "NCHW" else shape[3]
        image = channels is not None and channels == len(pre.mean) and channels in (1, 3)
        return cls(spec.input, pre if image else None, max_batch, max_pixels)

    @property
    def item_shape(self) -> tuple[int, ...]:
        """One input without the batch axis (the bundle's graphs take a batch of 1)."""
        shape = tuple(self.tensor.shape)
        return shape[1:] if shape and shape[0] == 1 else shape

    @property
    def batchable(self) -> bool:
        shape = tuple(self.tensor.shape)
        return bool(shape) and shape[0] == 1

    def image_preprocess(self) -> Preprocess:
        if self.preprocess is None:
            raise ApiError(415, "not_an_image_model", f"this bundle's input {list(self.tensor.shape)} is not an "
                                                      "image; send the tensor (.npy or JSON)")
        return self.preprocess

    @property
    def image_hwc(self) -> tuple[int, int, int]:
        """Height, width, channels of an image input."""
        pre = self.image_preprocess()
        shape = self.tensor.shape
        if pre.layout == "NCHW":
            return shape[2], shape[3], shape[1]
        return shape[1], shape[2], shape[3]


def decode(body: bytes, content_type: str | None, spec: InputSpec, fields: dict[str, Any] | None = None) -> np.ndarray:
    """The body as a batch ``[N, *item_shape]`` of the bundle's dtype, or an :class:`ApiError`.
    A JSON body's answer options (``top_k``, ``probabilities``) go into ``fields`` when given;
    without it they are refused."""
    media = (content_type or "").split(";")[0].strip().lower()
    if not body:
        raise ApiError(400, "empty_body", "the request body is empty; send a .npy tensor, JSON {\"inputs\": [...]}, "
                                          "or a JPEG/PNG image")
    if media in (NPY_MEDIA_TYPE, OCTET_MEDIA_TYPE):
        return decode_array(_load_npy(body), spec)
    if media == JSON_MEDIA_TYPE:
        values, raw = _json_inputs(body, spec, fields)
        return standardize(values, spec) if raw else _batch(_tensor(values, spec), spec)
    if media in IMAGE_MEDIA_TYPES:
        pixels = decode_image(body, IMAGE_MEDIA_TYPES[media], spec)
        return _batch(normalise(pixels[None], spec), spec)
    raise ApiError(415, "unsupported_media_type", f"content-type {media or '(none)'!r} is not supported; use one of "
                                                  f"{', '.join(MEDIA_TYPES)}")


def standardize(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    """Raw sequence values ``[C, L]`` or a batch ``[N, C, L]`` (any real dtype) as the model's tensor
    batch: ``(raw - mean) / std`` per channel, the bundle's standardization (:attr:`InputSpec.sequence`)."""
    pre = spec.sequence
    if pre is None:
        raise ApiError(400, "not_a_sequence_model", f"this bundle's input {list(spec.tensor.shape)} records no "
                                                    "sequence standardization; send the model's tensor")
    item = spec.item_shape
    if array.shape == item:
        array = array[None]
    if array.ndim != len(item) + 1 or array.shape[1:] != item or not array.shape[0]:
        raise ApiError(422, "bad_shape", f"raw values of shape {list(array.shape)}; the bundle expects "
                                         f"{list(item)} or a batch [N, {', '.join(map(str, item))}]")
    if array.dtype.kind not in "iuf" or not np.isfinite(array).all():
        raise ApiError(422, "bad_dtype", "raw values must be finite real numbers")
    mean = np.asarray(pre.mean, np.float64)[None, :, None]
    std = np.asarray(pre.std, np.float64)[None, :, None]
    return _batch(((array.astype(np.float64) - mean) / std).astype(numpy_dtype(spec.tensor.dtype)), spec)


def decode_array(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    """A decoded array as a batch: the model's tensor (one or a batch), or uint8 pixels that the
    bundle's preprocessing normalises."""
    if array.dtype == np.uint8 and spec.preprocess is not None and numpy_dtype(spec.tensor.dtype) != np.uint8:
        return _batch(normalise(_pixel_batch(array, spec), spec), spec)
    return _batch(_tensor(array, spec), spec)


def decode_encoded(data: bytes, spec: InputSpec) -> np.ndarray:
    """One input given as bytes (a v2 ``BYTES`` element, a multipart file): a JPEG or PNG image, a
    .npy array, or raw uint8 pixels ``[H, W, C]`` of exactly the model's input size; a batch."""
    if data.startswith(b"\xff\xd8\xff"):
        return _batch(normalise(decode_image(data, "JPEG", spec)[None], spec), spec)
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return _batch(normalise(decode_image(data, "PNG", spec)[None], spec), spec)
    if data.startswith(b"\x93NUMPY"):
        return decode_array(_load_npy(data), spec)
    h, w, c = spec.image_hwc
    if len(data) != h * w * c:
        raise ApiError(422, "bad_bytes", f"{len(data)} bytes are neither a JPEG, PNG or .npy file nor raw uint8 "
                                         f"pixels [H, W, C] = {[h, w, c]} ({h * w * c} bytes)")
    pixels = np.frombuffer(data, dtype=np.uint8).reshape(1, h, w, c)
    return _batch(normalise(pixels, spec), spec)


# -- tensors -------------------------------------------------------------------------------------


def _load_npy(body: bytes) -> np.ndarray:
    """The array in a .npy body, its header checked against the bytes that follow it before
    anything is allocated: numpy's loader sizes its buffer from the header, so a 100-byte
    body claiming an 8 GiB shape reserved 8 GiB of address space."""
    if not body.startswith(b"\x93NUMPY"):
        raise ApiError(400, "bad_npy", "body is not a .npy array (no \\x93NUMPY magic); an .npz, a pickle or raw "
                                       "bytes are not accepted")
    stream = io.BytesIO(body)
    try:
        major, _minor = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(stream, max_header_size=_MAX_NPY_HEADER_BYTES)
    except Exception as exc:
        detail = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ApiError(400, "bad_npy", f"body is not a valid .npy array: its header is malformed ({detail})") from exc
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ApiError(400, "bad_npy", f"a .npy array of dtype {str(dtype)[:40]} is not accepted; send numbers")
    data = memoryview(body)[stream.tell():]
    expected = math.prod(shape) * dtype.itemsize
    if expected != len(data):
        raise ApiError(400, "bad_npy", f"the .npy header claims shape {list(shape)[:8]} of {dtype} "
                                       f"({expected} bytes), the body carries {len(data)}")
    flat = np.frombuffer(data, dtype=dtype)
    return flat.reshape(shape, order="F" if fortran_order else "C").copy()


def _tensor(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    dtype = numpy_dtype(spec.tensor.dtype)
    if array.dtype != dtype:
        hint = " (or uint8 pixels [H, W, C])" if spec.preprocess is not None else ""
        raise ApiError(422, "bad_dtype", f"input dtype is {array.dtype}; the bundle expects {spec.tensor.dtype}{hint}")
    item = spec.item_shape
    if array.shape == item:
        array = array[None]
    elif not (spec.batchable and array.ndim == len(item) + 1 and array.shape[1:] == item and array.shape[0] >= 1):
        batch = f" or a batch {['N', *item]}" if spec.batchable else ""
        raise ApiError(422, "bad_shape", f"input shape is {list(array.shape)}; the bundle expects "
                                         f"{list(spec.tensor.shape)} (or {list(item)} without the batch axis{batch})")
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise ApiError(422, "non_finite", "input contains NaN or infinity; only finite numbers are accepted")
    return array


def _reject_constant(name: str) -> float:
    raise ApiError(422, "non_finite", f"inputs contain {name}; only finite numbers are accepted")


def _bounded_int(text: str) -> float:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ApiError(422, "bad_number", f"an integer in inputs has {len(text.lstrip('-'))} digits; "
                                          "inputs must be numbers within float32's range (|x| < 3.4e38)")
    return float(text)


_TYPE_HINTS = {bool: "booleans (true/false) are not numbers here",
               str: 'strings are not accepted, even numeric ones like "1.5"',
               type(None): "null is not a number",
               dict: "objects are not numbers",
               list: "the nested lists are not rectangular"}


JSON_OPTION_KEYS = ("top_k", "probabilities")


def _json_inputs(body: bytes, spec: InputSpec, fields: dict[str, Any] | None = None) -> tuple[np.ndarray, bool]:
    """The numbers of a JSON body, and whether they are raw sequence values (key ``raw``, a bundle
    with a sequence standardization; float64, standardized by the caller) or the tensor (``inputs``)."""
    try:
        doc = json.loads(body, parse_constant=_reject_constant, parse_int=_bounded_int)
    except ApiError:
        raise
    except RecursionError as exc:
        raise ApiError(400, "bad_json", "JSON is nested too deeply; inputs nest one list per axis") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_json", f"body is not valid JSON ({exc})") from exc
    shape_text = f"nested list of numbers of shape {list(spec.item_shape)}"
    key = "raw" if spec.sequence is not None and isinstance(doc, dict) and "raw" in doc else "inputs"
    if not isinstance(doc, dict) or key not in doc:
        raw_too = ' or {"raw": <the same, unstandardized>}' if spec.sequence is not None else ""
        raise ApiError(422, "bad_json", f'expected a JSON object {{"inputs": <{shape_text}>}}{raw_too}')
    allowed = {key, *(JSON_OPTION_KEYS if fields is not None else ())}
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise ApiError(422, "bad_json", f"unknown key(s) {[k[:40] for k in unknown][:5]}; expected some of "
                                        f"{sorted(allowed)}")
    if fields is not None:
        fields.update({k: doc[k] for k in JSON_OPTION_KEYS if k in doc})
    value = doc[key]
    if not isinstance(value, list):
        got = "null" if value is None else type(value).__name__
        raise ApiError(422, "bad_inputs", f"{key} is {got}; expected a {shape_text}")
    try:
        leaves = np.array(value, dtype=object)
    except (ValueError, TypeError) as exc:
        raise ApiError(422, "bad_inputs", f"{key} must be a rectangular {shape_text}") from exc
    kinds = set(map(type, leaves.flat))
    wrong = sorted((k for k in kinds if k not in (int, float)), key=lambda k: k.__name__)
    if wrong:
        hint = _TYPE_HINTS.get(wrong[0], f"{wrong[0].__name__} is not a number")
        raise ApiError(422, "bad_inputs", f"inputs must be a {shape_text}: {hint}")
    wide = leaves.astype(np.float64)
    if not np.all(np.isfinite(wide)):  # 1e999 parses as infinity
        raise ApiError(422, "non_finite", "inputs contain NaN or infinity; only finite numbers are accepted")
    if key == "raw":
        return wide, True
    dtype = numpy_dtype(spec.tensor.dtype)
    if np.issubdtype(dtype, np.integer):
        if not np.all(wide == np.round(wide)):
            raise ApiError(422, "bad_dtype", f"the bundle expects {spec.tensor.dtype}; inputs hold non-integers")
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise ApiError(422, "bad_number", f"inputs fall outside {spec.tensor.dtype}'s range")
    with np.errstate(over="ignore"):
        narrow = wide.astype(dtype)
    if np.issubdtype(dtype, np.floating) and not np.all(np.isfinite(narrow)):
        raise ApiError(422, "bad_number", f"inputs hold values beyond {spec.tensor.dtype}'s range")
    return narrow, False


def _batch(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    if array.shape[0] > spec.max_batch:
        raise ApiError(413, "batch_too_large", f"a batch of {array.shape[0]} inputs exceeds the limit of "
                                               f"{spec.max_batch}; split it")
    return np.ascontiguousarray(array)


# -- pixels --------------------------------------------------------------------------------------


def _pixel_batch(array: np.ndarray, spec: InputSpec) -> np.ndarray:
    h, w, c = spec.image_hwc
    if array.shape == (h, w, c):
        return array[None]
    if array.ndim == 4 and array.shape[1:] == (h, w, c) and array.shape[0] >= 1:
        return array
    if c == 1 and (array.shape == (h, w) or (array.ndim == 3 and array.shape[1:] == (h, w) and array.shape[0] >= 1)):
        return array.reshape(-1, h, w, 1)  # grey pixels without their channel axis, as image libraries give them
    grey = f", [{h}, {w}] or [N, {h}, {w}]" if c == 1 else ""
    raise ApiError(422, "bad_shape", f"uint8 pixels of shape {list(array.shape)}; the bundle expects [H, W, C] = "
                                     f"{[h, w, c]} or a batch [N, {h}, {w}, {c}]{grey}")


def normalise(pixels: np.ndarray, spec: InputSpec) -> np.ndarray:
    """uint8 ``[N, H, W, C]`` pixels -> the model's tensor batch (``(p / scale - mean) / std``, its layout)."""
    pre = spec.image_preprocess()
    dtype = numpy_dtype(spec.tensor.dtype)
    mean = np.asarray(pre.mean, dtype=np.float32)
    std = np.asarray(pre.std, dtype=np.float32)
    # One multiply-add per pixel: (p / scale - mean) / std == p * a + b.
    a = 1.0 / (np.float32(pre.pixel_scale) * std)
    b = -mean / std
    x = pixels.astype(np.float32) * a + b
    if pre.layout == "NCHW":
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x.astype(dtype, copy=False))


def decode_image(data: bytes, fmt: str, spec: InputSpec) -> np.ndarray:
    """One JPEG/PNG as uint8 ``[H, W, C]`` at the model's input size, bounded before decoding."""
    h, w, c = spec.image_hwc
    try:
        from PIL import Image
    except ImportError as exc:  # Pillow is a base dependency; this is a broken install
        raise ApiError(415, "images_unsupported", "image bodies need Pillow (pip install pillow); send the "
                                                  "tensor as .npy instead") from exc
    try:
        opened = Image.open(io.BytesIO(data), formats=[fmt])  # reads the header only
    except Exception as exc:
        raise ApiError(400, "bad_image", f"body is not a readable {fmt} image") from exc
    width, height = opened.size
    if width < 1 or height < 1 or width * height > spec.max_pixels:
        raise ApiError(413, "image_too_large", f"{fmt} image of {width} x {height} pixels; at most "
                                               f"{spec.max_pixels} pixels are decoded")
    mode = "RGB" if c == 3 else "L"
    try:
        if fmt == "JPEG" and (width > 2 * w and height > 2 * h):
            opened.draft(mode, (w, h))  # let libjpeg scale down while decoding (cheaper, bounded)
        image = opened.convert(mode)
        if image.size != (w, h):
            image = image.resize((w, h), Image.Resampling.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    except Exception as exc:
        raise ApiError(400, "bad_image", f"{fmt} image could not be decoded (truncated or corrupt)") from exc
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.shape != (h, w, c) or not math.prod(pixels.shape):
        raise ApiError(400, "bad_image", f"{fmt} image decoded to {list(pixels.shape)}, not {[h, w, c]}")
    return pixels


def as_items(batch: np.ndarray, spec: InputSpec) -> list[np.ndarray]:
    """A decoded batch as the graphs' own inputs (each of the bundle's full shape, batch axis 1)."""
    shape = tuple(spec.tensor.shape)
    return [np.ascontiguousarray(item.reshape(shape)) for item in batch]
