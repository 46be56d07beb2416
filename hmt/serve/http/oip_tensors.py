"""Tensors of the Open Inference Protocol (KServe v2) over HTTP: JSON and the binary-data extension.

A request's JSON header lists its inputs as ``{"name", "shape", "datatype", "data" | "parameters":
{"binary_data_size": n}}``; with the binary-data extension (Triton's ``binary_tensor_data``) the
header is the first ``Inference-Header-Content-Length`` bytes of the body and each binary input's
bytes follow in order: little-endian, row-major, and for ``BYTES`` each element as a 4-byte
little-endian length and its bytes. Outputs go back the same way when asked (request parameter
``binary_data_output`` or an output's ``binary_data``).

In JSON, ``BYTES`` elements are base64 text (the KServe convention for images); binary ``BYTES``
are the raw bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hmt.serve.http.inputs import ApiError

HEADER_LENGTH = "inference-header-content-length"
DATATYPES: dict[str, str] = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64",
                             "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "uint16": "UINT16",
                             "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL"}
NUMPY_OF: dict[str, np.dtype[Any]] = {v: np.dtype(k).newbyteorder("<") for k, v in DATATYPES.items()}
BYTES = "BYTES"
MAX_ELEMENTS = 1 << 27


def datatype_of(dtype: str | np.dtype[Any]) -> str:
    return DATATYPES[np.dtype(dtype).name]


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray | None = None  # numeric data
    items: list[bytes] = field(default_factory=list)  # BYTES data


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None  # the output's own binary_data; None: the request's binary_data_output decides
    classification: int | None = None  # Triton's classification extension: top k as "p:index[:name]"


@dataclass
class InferRequest:
    id: str | None
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None  # None: the default outputs
    binary_output: bool
    parameters: dict[str, Any]


def _reject_constant(name: str) -> float:
    raise ApiError(400, "non_finite", f"the request contains {name}; only finite numbers are accepted")


# Content-Encoding of a request body (what tritonclient's request_compression_algorithm sends:
# gzip.compress, or zlib.compress for "deflate", RFC 9110 8.4.1) -> zlib's wbits for it.
CONTENT_ENCODINGS = {"identity": 0, "gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
                     "deflate": zlib.MAX_WBITS}


def decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` without its Content-Encoding (one of :data:`CONTENT_ENCODINGS`), refused with 413 as
    soon as it would grow past ``limit`` bytes: a small compressed body cannot become a large one."""
    wbits = CONTENT_ENCODINGS[encoding]
    if not wbits:
        return body
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit or inflater.unconsumed_tail:
            raise ApiError(413, "body_too_large", f"the {encoding} body inflates past the limit of {limit} bytes")
        if not inflater.eof or inflater.unused_data:
            raise ApiError(400, "bad_encoding", f"the body is not one complete {encoding} stream")
    except zlib.error as exc:
        raise ApiError(400, "bad_encoding", f"the body is not valid {encoding} data ({exc})") from None
    return out


def _load_header(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        header, rest = body, b""
    else:
        try:
            size = int(header_length)
        except ValueError:
            raise ApiError(400, "bad_header_length", f"Inference-Header-Content-Length {header_length[:20]!r} is not "
                                                     "an integer") from None
        if not 0 < size <= len(body):
            raise ApiError(400, "bad_header_length", f"Inference-Header-Content-Length {size} is outside the body's "
                                                     f"{len(body)} bytes")
        header, rest = body[:size], body[size:]
    try:
        doc = json.loads(header, parse_constant=_reject_constant)
    except ApiError:
        raise
    except RecursionError:
        raise ApiError(400, "bad_json", "the request JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "bad_json", f"the request header is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "bad_json", "the request must be a JSON object with \"inputs\"")
    return doc, rest


def _params(value: Any, where: str, allowed: Sequence[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ApiError(400, "bad_parameters", f"{where}.parameters must be an object")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ApiError(400, "bad_parameters", f"{where}: parameter(s) {[u[:40] for u in unknown][:5]} are not "
                                              f"supported; expected some of {list(allowed)}")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value) or len(value) > 8:
        raise ApiError(400, "bad_shape", f"{where}.shape must be a list of at most 8 non-negative integers")
    if math.prod(value) > MAX_ELEMENTS:
        raise ApiError(413, "tensor_too_large", f"{where}.shape {value} has more than {MAX_ELEMENTS} elements")
    return tuple(value)


def _flat(data: Any, where: str) -> list[Any]:
    """Row-major elements of ``data``: a flat list or nested lists (the protocol allows both)."""
    out: list[Any] = []
    stack = [iter(data if isinstance(data, list) else [data])]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) > 9:
                    raise ApiError(400, "bad_data", f"{where}.data nests deeper than the shape allows")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _numeric_json(data: list[Any], datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    dtype = NUMPY_OF[datatype]
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in data):
            raise ApiError(400, "bad_data", f"{where}.data must hold booleans for BOOL")
        return np.array(data, dtype=bool).reshape(shape)
    if not all(type(v) in (int, float) for v in data):
        raise ApiError(400, "bad_data", f"{where}.data must hold numbers only for {datatype} (no strings, booleans "
                                        "or null)")
    try:
        wide = np.array(data, dtype=np.float64)
    except OverflowError:
        raise ApiError(400, "bad_data", f"{where}.data holds an integer beyond float64's range") from None
    if not np.all(np.isfinite(wide)):
        raise ApiError(400, "non_finite", f"{where}.data holds NaN or infinity")
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if not np.all(wide == np.round(wide)) or (wide.size and (wide.min() < info.min or wide.max() > info.max)):
            raise ApiError(400, "bad_data", f"{where}.data holds values that are not {datatype} integers")
    with np.errstate(over="ignore"):
        narrow = wide.astype(dtype)
    if np.issubdtype(dtype, np.floating) and not np.all(np.isfinite(narrow)):
        raise ApiError(400, "bad_data", f"{where}.data holds values beyond {datatype}'s range")
    return narrow.reshape(shape)


def _bytes_elements(raw: bytes, count: int, where: str) -> list[bytes]:
    items: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise ApiError(400, "bad_binary", f"{where}: BYTES data ends inside an element's length prefix")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise ApiError(400, "bad_binary", f"{where}: a BYTES element of {size} bytes runs past the data")
        items.append(raw[offset:offset + size])
        offset += size
    if len(items) != count:
        raise ApiError(400, "bad_binary", f"{where}: {len(items)} BYTES elements for a shape of {count}")
    return items


# content_type (also a request parameter): the codec hint MLServer's codecs write on the request and
# each input ("np", "base64", ...); the datatype and shape say all this server reads.
INPUT_PARAMETERS = ("binary_data_size", "content_type")


def _input(spec: Any, index: int, binary: memoryview, offset: int) -> tuple[InputTensor, int]:
    where = f"inputs[{index}]"
    if not isinstance(spec, dict):
        raise ApiError(400, "bad_input", f"{where} must be an object {{name, shape, datatype, data}}")
    name, datatype = spec.get("name"), spec.get("datatype")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise ApiError(400, "bad_input", f"{where} needs a string name and datatype")
    if datatype != BYTES and datatype not in NUMPY_OF:
        raise ApiError(400, "bad_datatype", f"{where} ({name[:40]}): datatype {datatype[:20]!r} is not one of "
                                            f"{[*NUMPY_OF, BYTES]}")
    shape = _shape(spec.get("shape"), where)
    count = math.prod(shape)
    params = _params(spec.get("parameters"), where, INPUT_PARAMETERS)
    if not isinstance(params.get("content_type", ""), str):
        raise ApiError(400, "bad_parameters", f"{where}: content_type must be a string")
    tensor = InputTensor(name, datatype, shape)
    size = params.get("binary_data_size")
    if size is not None:
        if type(size) is not int or size < 0 or offset + size > len(binary):
            raise ApiError(400, "bad_binary", f"{where}: binary_data_size {str(size)[:20]} is not within the "
                                              f"{len(binary) - offset} binary bytes left")
        if "data" in spec:
            raise ApiError(400, "bad_input", f"{where} has both data and binary_data_size")
        raw = bytes(binary[offset:offset + size])
        offset += size
        if datatype == BYTES:
            tensor.items = _bytes_elements(raw, count, where)
        else:
            dtype = NUMPY_OF[datatype]
            if size != count * dtype.itemsize:
                raise ApiError(400, "bad_binary", f"{where}: {size} bytes for {count} {datatype} elements "
                                                  f"({count * dtype.itemsize} bytes expected)")
            tensor.array = np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
        return tensor, offset
    if "data" not in spec:
        raise ApiError(400, "bad_input", f"{where} has neither data nor parameters.binary_data_size")
    data = _flat(spec["data"], where)
    if len(data) != count:
        raise ApiError(400, "bad_shape", f"{where}: {len(data)} elements for shape {list(shape)} ({count} expected)")
    if datatype == BYTES:
        try:
            tensor.items = [base64.b64decode(v, validate=True) for v in data]
        except (TypeError, binascii.Error, ValueError):
            raise ApiError(400, "bad_data", f"{where}.data: BYTES elements in JSON must be base64 strings (or send "
                                            "them with the binary-data extension)") from None
    else:
        tensor.array = _numeric_json(data, datatype, shape, where)
    return tensor, offset


def _outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ApiError(400, "bad_outputs", "outputs must be a non-empty list of {name, parameters}")
    outputs = []
    for i, spec in enumerate(value):
        where = f"outputs[{i}]"
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ApiError(400, "bad_outputs", f"{where} must be an object with a string name")
        params = _params(spec.get("parameters"), where, ("binary_data", "classification"))
        binary = params.get("binary_data")
        k = params.get("classification")
        if not isinstance(binary, (bool, type(None))) or (k is not None and (type(k) is not int or k < 1)):
            raise ApiError(400, "bad_outputs", f"{where}: binary_data must be a boolean and classification an "
                                               "integer >= 1")
        outputs.append(RequestedOutput(spec["name"], binary, k))
    return outputs


# priority: Triton's scheduling hint (tritonclient's infer(priority=...)); one level here, so not read.
REQUEST_PARAMETERS = ("binary_data_output", "top_k", "timeout", "priority", "content_type")
# Keys beside the protocol's own that clients write into a request (KServe's Python client,
# InferRequest.to_rest, puts model_name in every one); the path names the model, so they are not read.
NAMED_BY_PATH = ("model_name", "model_version")


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    doc, rest = _load_header(body, header_length)
    unknown = sorted(set(doc) - {"id", "inputs", "outputs", "parameters", *NAMED_BY_PATH})
    if unknown:
        raise ApiError(400, "bad_json", f"unknown key(s) {[u[:40] for u in unknown][:5]} in the request")
    for key in NAMED_BY_PATH:
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise ApiError(400, "bad_json", f"{key} must be a string")
    params = _params(doc.get("parameters"), "request", REQUEST_PARAMETERS)
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ApiError(400, "bad_json", "id must be a string")
    specs = doc.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise ApiError(400, "bad_input", "inputs must be a non-empty list")
    binary = memoryview(rest)
    offset = 0
    inputs = []
    for i, spec in enumerate(specs):
        tensor, offset = _input(spec, i, binary, offset)
        inputs.append(tensor)
    if offset != len(rest):
        raise ApiError(400, "bad_binary", f"{len(rest) - offset} binary bytes after the last input are not claimed "
                                          "by any binary_data_size")
    binary_output = params.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise ApiError(400, "bad_parameters", "binary_data_output must be a boolean")
    priority = params.get("priority", 0)
    if type(priority) is not int or priority < 0:
        raise ApiError(400, "bad_parameters", "priority must be a non-negative integer")
    if not isinstance(params.get("content_type", ""), str):
        raise ApiError(400, "bad_parameters", "content_type must be a string")
    return InferRequest(request_id, inputs, _outputs(doc.get("outputs")), binary_output, params)


# -- the response --------------------------------------------------------------------------------


def _encode_bytes(items: Sequence[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def response_body(header: dict[str, Any], tensors: Sequence[tuple[str, str, np.ndarray, bool]],
                  extra: Mapping[str, Any] | None = None) -> tuple[bytes, int | None]:
    """The body of an inference response and its JSON header's length (None: all JSON).

    ``tensors``: (name, datatype, data, binary); a BYTES tensor is an object array of ``bytes``."""
    outputs = []
    chunks: list[bytes] = []
    for name, datatype, data, binary in tensors:
        if datatype == BYTES:
            shape = list(data.shape)
            flat = [bytes(v) for v in data.reshape(-1)]
            if binary:
                raw = _encode_bytes(flat)
                outputs.append({"name": name, "datatype": datatype, "shape": shape,
                                "parameters": {"binary_data_size": len(raw)}})
                chunks.append(raw)
            else:
                outputs.append({"name": name, "datatype": datatype, "shape": shape,
                                "data": [v.decode("utf-8", "replace") for v in flat]})
            continue
        array = np.ascontiguousarray(data, dtype=NUMPY_OF[datatype])
        if binary:
            raw = array.tobytes()
            outputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                            "parameters": {"binary_data_size": len(raw)}})
            chunks.append(raw)
        else:
            outputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                            "data": array.reshape(-1).tolist()})
    doc = {**header, "outputs": outputs}
    if extra:
        doc["parameters"] = dict(extra)
    text = json.dumps(doc, separators=(",", ":")).encode()
    if not chunks:
        return text, None
    return text + b"".join(chunks), len(text)
