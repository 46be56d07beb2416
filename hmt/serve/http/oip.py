"""The Open Inference Protocol (KServe v2) over HTTP, beside ``/v1``: what Triton and KServe clients speak.

Routes (one model: the bundle; its one version ``1``)::

    GET  /v2                                       server metadata (extensions: binary_tensor_data, classification,
                                                   model_configuration, statistics)
    GET  /v2/health/live | /v2/health/ready        200 or 503
    GET  /v2/models/{model}[/versions/1]           model metadata
    GET  /v2/models/{model}[/versions/1]/ready     200 or 503
    GET  /v2/models/{model}[/versions/1]/config    Triton's model configuration (max_batch_size, input, output)
    GET  /v2/models[/{model}[/versions/1]]/stats   Triton's statistics (:mod:`hmt.serve.reporting.inference_stats`)
    POST /v2/models/{model}[/versions/1]/infer     inference (JSON, or the binary-data extension)

**Inputs.** One input per request: the bundle's tensor under its own name (its datatype, shape ``[N,
...]`` or without the batch axis; ``UINT8`` pixels ``[N, H, W, C]`` for an image model, normalised
with the bundle's preprocessing), or ``image`` (``BYTES [N]``): JPEG, PNG, .npy or raw uint8 pixels
per element, also through the preprocessing, or for a sequence model ``raw`` (FP32, the tensor's
shape): unstandardized values, standardized per channel as the model was trained. **Outputs**:
``class`` (INT64 [N]), ``confidence`` (FP32 [N]), ``exit`` (INT32 [N]), ``variant`` (BYTES [N]),
``class_name`` (BYTES [N], when the bundle names its classes); on request ``probabilities`` (FP32
[N, C], or with the output parameter ``classification: k`` Triton's BYTES [N, k] of
``"p:index[:name]"``), and with the request parameter ``top_k: k`` also ``top_k_classes`` (INT64 [N,
k]) and ``top_k_probabilities`` (FP32 [N, k]); named without the parameter, k is 5 (at most the
classes). Triton's ``priority`` and the codec hint ``content_type`` are accepted and change nothing;
other unknown parameters (a ``sequence_id``: this model keeps no state), inputs and outputs are
refused.

**Errors** are the protocol's ``{"error": "<message>"}`` with the same statuses as ``/v1`` (the
token, body bound, queue, deadline and typed refusals are the same code). Header ``X-Deadline-Ms``
may lower the deadline; so may the request parameter ``timeout`` (microseconds), but, as in
Triton, only where the model is configured with dynamic batching (``--dynamic-batch``: the model
configuration then shows a queue policy that lets a request's timeout override it). Elsewhere
Triton ignores it, and clients send it thinking it ignored: tritony sends ``timeout=30``, meant as
seconds, with every request. A request body may be compressed (``Content-Encoding: gzip`` or ``deflate``, as
tritonclient's ``request_compression_algorithm`` sends it); inflated, it is held to the same bound.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hmt import __version__
from hmt.serve.http.answers import class_name, parse_top_k, probabilities_of, top_k_of
from hmt.serve.http.inputs import ApiError, InputSpec, as_items, decode_array, decode_encoded, standardize
from hmt.serve.http.oip_tensors import (
    BYTES,
    CONTENT_ENCODINGS,
    HEADER_LENGTH,
    InferRequest,
    datatype_of,
    decode_content,
    parse_request,
    response_body,
)
from hmt.serve.reporting.inference_stats import InferenceStats
from hmt.serve.reporting.records import Prediction
from hmt.serve.running.batching import BatchingOptions

PREFIX = "/v2"
IMAGE_INPUT = "image"
RAW_INPUT = "raw"  # a sequence bundle's unstandardized values (FP32, the tensor's shape)
VERSION = "1"
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")
DEFAULT_TOP_K = 5  # k of a top-k output named without the request parameter top_k
_MODEL_PATH = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?(/ready|/infer|/config|/stats)?$")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The protocol's error body."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def route_label(path: str) -> str:
    """A bounded label for a /v2 path (metrics and counts): the route's template, or ``other``."""
    if path in (PREFIX, f"{PREFIX}/health/live", f"{PREFIX}/health/ready", f"{PREFIX}/models/stats"):
        return path
    match = _MODEL_PATH.match(path)
    return f"{PREFIX}/models/{{model}}{match.group(1) or ''}" if match is not None else "other"


INFER_LABEL = f"{PREFIX}/models/{{model}}/infer"


@dataclass(frozen=True)
class OipContext:
    """What the v2 routes share with ``/v1`` (built by :func:`hmt.serve.http.api.create_app`)."""

    controller: Any
    inputs: InputSpec
    model_name: str
    draining: threading.Event
    deadline_ms: float
    read_body: Callable[[Request], Awaitable[bytes]]
    body_limit: int  # bytes of a body, also once its Content-Encoding is undone
    # (prepare, first_byte_s, deadline_ms, received_s, heavy=, tightened_ms=): admission, decoding off
    # the event loop, inference (hmt.serve.http.service.InferenceService.submit)
    submit: Callable[..., Awaitable[list[Prediction]]]
    stats: InferenceStats  # every request's outcome, both protocols (the statistics extension)
    batching: BatchingOptions  # serve's dynamic batcher (shown in the model configuration)
    deadline_header: Callable[[Request], float | None]
    first_byte_s: Callable[[Request], float]
    internal_error: Callable[[BaseException], str]  # logs, returns the client's message


def _tensor_meta(ctx: OipContext) -> list[dict[str, Any]]:
    spec = ctx.inputs
    shape = [-1, *spec.item_shape] if spec.batchable else list(spec.tensor.shape)
    inputs = [{"name": spec.tensor.name, "datatype": datatype_of(spec.tensor.dtype), "shape": shape}]
    if spec.preprocess is not None:
        inputs.append({"name": IMAGE_INPUT, "datatype": BYTES, "shape": [-1]})
    if spec.sequence is not None:
        inputs.append({"name": RAW_INPUT, "datatype": "FP32", "shape": shape})
    return inputs


def _output_meta(ctx: OipContext) -> list[dict[str, Any]]:
    classes = ctx.controller.bundle.spec.classes
    outputs = [{"name": "class", "datatype": "INT64", "shape": [-1]},
               {"name": "confidence", "datatype": "FP32", "shape": [-1]},
               {"name": "exit", "datatype": "INT32", "shape": [-1]},
               {"name": "variant", "datatype": BYTES, "shape": [-1]}]
    if ctx.controller.bundle.spec.class_names:
        outputs.append({"name": "class_name", "datatype": BYTES, "shape": [-1]})
    outputs += [{"name": "probabilities", "datatype": "FP32", "shape": [-1, classes]},
                {"name": "top_k_classes", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "top_k_probabilities", "datatype": "FP32", "shape": [-1, -1]}]
    return outputs


def model_metadata(ctx: OipContext) -> dict[str, Any]:
    controller = ctx.controller
    spec = controller.bundle.spec
    names = [t["name"] for t in _tensor_meta(ctx)]
    return {
        "name": ctx.model_name, "versions": [VERSION], "platform": "hmt_bundle",
        "inputs": _tensor_meta(ctx), "outputs": _output_meta(ctx),
        "parameters": {
            "variants": ",".join(v.arch_id for v in spec.variants),
            "running_variant": controller.active_arch_id or "",
            "classes": spec.classes,
            "one_input_of": ",".join(names),
            "default_outputs": "class,confidence,exit,variant" + (",class_name" if spec.class_names else ""),
        },
    }


def _config_tensor(meta: dict[str, Any], batched: bool) -> dict[str, Any]:
    """One metadata tensor as Triton's ModelInput/ModelOutput (model_config.proto): ``dims`` without
    the batch axis when the model batches; a scalar per item is ``dims [1]`` reshaped to ``[]``."""
    dims = list(meta["shape"][1:] if batched else meta["shape"])
    data_type = "TYPE_STRING" if meta["datatype"] == BYTES else f"TYPE_{meta['datatype']}"
    tensor: dict[str, Any] = {"name": meta["name"], "data_type": data_type, "dims": dims or [1]}
    if not dims:
        tensor["reshape"] = {"shape": []}
    return tensor


def model_config(ctx: OipContext) -> dict[str, Any]:
    """Triton's model configuration extension: the ModelConfig message as JSON (what
    ``get_model_config`` returns; PyTriton's client and Triton's examples read ``max_batch_size``,
    ``input`` and ``output`` from it). Every input is optional: a request sends one of them."""
    spec = ctx.inputs
    batched = spec.batchable
    inputs = []
    for meta in _tensor_meta(ctx):
        tensor = {**_config_tensor(meta, batched), "optional": True}
        if meta["name"] == spec.tensor.name and spec.preprocess is not None and len(tensor["dims"]) == 3:
            tensor["format"] = f"FORMAT_{spec.preprocess.layout}"
        inputs.append(tensor)
    metadata = model_metadata(ctx)
    config: dict[str, Any] = {
        "name": ctx.model_name, "platform": metadata["platform"], "backend": "hmt",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": spec.max_batch if batched else 0,
        "input": inputs, "output": [_config_tensor(meta, batched) for meta in _output_meta(ctx)],
        "parameters": {key: {"string_value": str(value)} for key, value in metadata["parameters"].items()},
    }
    if ctx.batching.enabled:  # a request's timeout parameter applies (a 504 past it), as in Triton
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": int(ctx.batching.max_delay_ms * 1e3),
            "default_queue_policy": {"timeout_action": "REJECT", "allow_timeout_override": True}}
    return config


def _batch_of(request: InferRequest, ctx: OipContext) -> np.ndarray:
    if len(request.inputs) != 1:
        raise ApiError(400, "bad_input", f"send one input per request (got {len(request.inputs)}): "
                                         f"{' or '.join(t['name'] for t in _tensor_meta(ctx))}")
    tensor = request.inputs[0]
    spec = ctx.inputs
    if tensor.name == IMAGE_INPUT and spec.preprocess is not None:
        if tensor.datatype != BYTES or len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2
                                                                          and tensor.shape[1] != 1):
            raise ApiError(400, "bad_input", f"input {IMAGE_INPUT!r} is BYTES of shape [N] (one encoded image or raw "
                                             "pixels per element)")
        if not tensor.items:
            raise ApiError(400, "bad_input", f"input {IMAGE_INPUT!r} holds no elements")
        if len(tensor.items) > spec.max_batch:
            raise ApiError(413, "batch_too_large", f"a batch of {len(tensor.items)} inputs exceeds the limit of "
                                                   f"{spec.max_batch}; split it")
        return np.concatenate([decode_encoded(item, spec) for item in tensor.items])
    if tensor.name == RAW_INPUT and spec.sequence is not None:
        if tensor.array is None:
            raise ApiError(400, "bad_datatype", f"input {RAW_INPUT!r} is numbers (FP32), not BYTES")
        return standardize(tensor.array, spec)
    if tensor.name != spec.tensor.name:
        raise ApiError(400, "unknown_input", f"unknown input {tensor.name[:40]!r}; this model takes "
                                             f"{' or '.join(repr(t['name']) for t in _tensor_meta(ctx))}")
    if tensor.array is None:
        raise ApiError(400, "bad_datatype", f"input {tensor.name!r} is {datatype_of(spec.tensor.dtype)}, not BYTES")
    return decode_array(tensor.array, spec)


def _deadline_ms(request: Request, ctx: OipContext) -> float:
    """The deadline known before the body is parsed: the server's, or the header's when shorter."""
    deadline = ctx.deadline_ms
    asked = ctx.deadline_header(request)
    if asked is not None:
        deadline = min(deadline, asked)
    return deadline


def _timeout_ms(parsed: InferRequest, ctx: OipContext) -> float | None:
    """The request's own ``timeout`` parameter (microseconds), in ms, where it applies (once parsed):
    with the dynamic batcher on, as Triton respects it only for a model with dynamic batching."""
    timeout_us = parsed.parameters.get("timeout")
    if timeout_us is None:
        return None
    if type(timeout_us) is not int or timeout_us <= 0:
        raise ApiError(400, "bad_parameters", "parameter timeout must be a positive integer of microseconds")
    return timeout_us / 1e3 if ctx.batching.enabled else None


def _check_outputs(parsed: InferRequest, ctx: OipContext) -> None:
    """Refuse the requested outputs and ``top_k`` before the inputs run (as ``/v1`` does): a 400
    after inference would have spent the compute and counted the request as answered."""
    spec = ctx.controller.bundle.spec
    if parsed.parameters.get("top_k") is not None:
        parse_top_k(parsed.parameters["top_k"], spec.classes, "parameter top_k")
    names = sorted(meta["name"] for meta in _output_meta(ctx))
    for out in parsed.outputs or ():
        if out.name not in names:
            raise ApiError(400, "unknown_output", f"unknown output {out.name[:40]!r}; this model has {names}")
        if out.classification is not None and out.name != "probabilities":
            raise ApiError(400, "bad_outputs", "classification applies to the output 'probabilities'")


def _outputs(parsed: InferRequest, results: Sequence[Prediction], ctx: OipContext) -> list[tuple[str, str,
                                                                                                 np.ndarray, bool]]:
    spec = ctx.controller.bundle.spec
    names = spec.class_names
    top_k = parsed.parameters.get("top_k")
    # The metadata lists the top-k outputs, so a client may name them without the parameter
    # (clients that ask for every listed output): then k is DEFAULT_TOP_K.
    k = min(DEFAULT_TOP_K, spec.classes) if top_k is None else parse_top_k(top_k, spec.classes, "parameter top_k")

    def words(values: Sequence[str | None]) -> np.ndarray:
        return np.array([(v or "").encode() for v in values], dtype=object)

    def probabilities() -> np.ndarray:
        return np.stack([probabilities_of(p) for p in results])

    def classification(count: int) -> np.ndarray:
        probs = probabilities()
        rows = []
        for row in probs:
            picked = top_k_of(row, min(count, spec.classes))
            rows.append([(f"{row[i]:.6f}:{int(i)}" + (f":{names[i]}" if names else "")).encode() for i in picked])
        return np.array(rows, dtype=object)

    available: dict[str, tuple[str, Callable[[], np.ndarray]]] = {
        "class": ("INT64", lambda: np.array([p.class_index for p in results], dtype=np.int64)),
        "confidence": ("FP32", lambda: np.array([p.confidence for p in results], dtype=np.float32)),
        "exit": ("INT32", lambda: np.array([p.exit for p in results], dtype=np.int32)),
        "variant": (BYTES, lambda: words([p.variant for p in results])),
        "probabilities": ("FP32", probabilities),
    }
    if names:
        available["class_name"] = (BYTES, lambda: words([class_name(names, p.class_index) for p in results]))
    available["top_k_classes"] = ("INT64", lambda: np.stack([top_k_of(r, k) for r in probabilities()]))
    available["top_k_probabilities"] = ("FP32", lambda: np.stack([np.sort(r)[::-1][:k] for r in probabilities()]))
    if parsed.outputs is None:
        default = ["class", "confidence", "exit", "variant", *(["class_name"] if names else []),
                   *(["top_k_classes", "top_k_probabilities"] if top_k is not None else [])]
        return [(n, available[n][0], available[n][1](), parsed.binary_output) for n in default]
    tensors = []
    for out in parsed.outputs:  # names and classification checked before inference (_check_outputs)
        binary = parsed.binary_output if out.binary is None else out.binary  # the output's own word wins
        if out.classification is not None:
            tensors.append((out.name, BYTES, classification(out.classification), binary))
        else:
            datatype, make = available[out.name]
            tensors.append((out.name, datatype, make(), binary))
    return tensors


def _guarded(ctx: OipContext, handler: Callable[[Request], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` with every failure answered as an OIP error: one bad request never takes the server down."""
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.message, exc.headers)
        except ClientDisconnect:
            return error_response(400, "the client disconnected")
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
            return error_response(500, ctx.internal_error(exc))

    return wrapped


class _Endpoints:
    """The /v2 handlers over one :class:`OipContext`."""

    def __init__(self, ctx: OipContext) -> None:
        self.ctx = ctx

    def check_model(self, request: Request) -> None:
        model = request.path_params["model"]
        version = request.path_params.get("version", VERSION)
        if model != self.ctx.model_name or version != VERSION:
            raise ApiError(404, "unknown_model", f"unknown model {model[:60]!r} version {version[:20]!r}; this server "
                                                 f"serves {self.ctx.model_name!r} version {VERSION}")

    def check_ready(self) -> None:
        if self.ctx.draining.is_set():
            raise ApiError(503, "shutting_down", "the server is shutting down")
        if not self.ctx.controller.ready:
            raise ApiError(503, "not_ready", "no variant is loaded and warm yet", headers={"Retry-After": "1"})

    async def server_metadata(self, request: Request) -> Response:
        return JSONResponse({"name": "hmt", "version": __version__, "extensions": list(EXTENSIONS)})

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, request: Request) -> Response:
        self.check_ready()
        return JSONResponse({"ready": True})

    async def metadata(self, request: Request) -> Response:
        self.check_model(request)
        return JSONResponse(model_metadata(self.ctx))

    async def config(self, request: Request) -> Response:
        self.check_model(request)
        return JSONResponse(model_config(self.ctx))

    async def statistics(self, request: Request) -> Response:
        if "model" in request.path_params:  # else every model's: this one
            self.check_model(request)
        return JSONResponse({"model_stats": [self.ctx.stats.model_stat(self.ctx.model_name, VERSION)]})

    async def model_ready(self, request: Request) -> Response:
        self.check_model(request)
        self.check_ready()
        return JSONResponse({"name": self.ctx.model_name, "ready": True})

    async def infer(self, request: Request) -> Response:
        ctx = self.ctx
        self.check_model(request)
        first_byte_s = ctx.first_byte_s(request)
        self.check_ready()
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in CONTENT_ENCODINGS:
            raise ApiError(415, "unsupported_encoding", f"Content-Encoding {encoding[:20]!r} is not accepted; send "
                                                        f"the request as one of {sorted(CONTENT_ENCODINGS)}",
                           headers={"Accept-Encoding": ", ".join(sorted(CONTENT_ENCODINGS))})
        body = await ctx.read_body(request)
        received_s = time.monotonic()
        if not body:
            raise ApiError(400, "empty_body", "the request body is empty; send an inference request JSON object")
        header_length = request.headers.get(HEADER_LENGTH)
        deadline_ms = _deadline_ms(request, ctx)
        parsed_once: list[tuple[InferRequest, float | None]] = []

        def prepare() -> list[np.ndarray]:  # in the decoding lane, admitted to the queue first
            parsed = parse_request(decode_content(body, encoding, ctx.body_limit), header_length)
            _check_outputs(parsed, ctx)
            parsed_once.append((parsed, _timeout_ms(parsed, ctx)))
            return as_items(_batch_of(parsed, ctx), ctx.inputs)

        results = await ctx.submit(prepare, first_byte_s, deadline_ms, received_s, heavy=True,
                                   tightened_ms=lambda: parsed_once[0][1])
        parsed = parsed_once[0][0]
        header: dict[str, Any] = {"model_name": ctx.model_name, "model_version": VERSION}
        if parsed.id is not None:
            header["id"] = parsed.id
        content, json_size = response_body(header, _outputs(parsed, results, ctx))
        if json_size is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_size)})


def oip_routes(ctx: OipContext) -> list[Route]:
    """The v2 routes over ``ctx`` (the token guard sits below the app and covers them)."""
    ends = _Endpoints(ctx)

    def route(path: str, handler: Callable[[Request], Awaitable[Response]], method: str) -> Route:
        return Route(path, _guarded(ctx, handler), methods=[method])

    routes = [route(PREFIX, ends.server_metadata, "GET"),
              route(f"{PREFIX}/health/live", ends.live, "GET"),
              route(f"{PREFIX}/health/ready", ends.ready, "GET"),
              route(f"{PREFIX}/models/stats", ends.statistics, "GET")]  # before /models/{model}
    for base in (f"{PREFIX}/models/{{model}}", f"{PREFIX}/models/{{model}}/versions/{{version}}"):
        routes += [route(base, ends.metadata, "GET"),
                   route(f"{base}/ready", ends.model_ready, "GET"),
                   route(f"{base}/config", ends.config, "GET"),
                   route(f"{base}/stats", ends.statistics, "GET"),
                   route(f"{base}/infer", ends.infer, "POST")]
    return routes
