"""The inference API: a starlette app over a :class:`~hmt.serve.controller.Controller`.

Endpoints (see :func:`hmt.serve.reporting.exposition.openapi_document`): ``POST /v1/predict``,
``GET /v1/health/live``, ``GET /v1/health/ready``, ``GET /v1/status``, ``GET /metrics``
(:mod:`hmt.serve.reporting.metrics`), ``GET /openapi.json``, and the Open Inference Protocol
under ``/v2`` (:mod:`hmt.serve.http.oip`). Every ``/v1`` error is JSON ``{"error": {"code",
"message"}}``; a 500 says only that it happened (with an id to find it in the log), never the
exception's text.

Guards, in request order (below the app, :mod:`hmt.serve.http.connections` caps connections
and bounds how long a request may take to arrive): the bearer token (when one is set, on
every path but, with ``health_without_token``, ``/v1/health/*`` and ``/v2/health/*``;
constant-time compare; :mod:`hmt.serve.http.guard`); readiness (503); the body bound
(``Content-Length`` first, then the streamed bytes, 413); admission to a bounded queue (429
when full); then, off the event loop (:mod:`hmt.serve.http.service`), decoding
(:mod:`hmt.serve.http.inputs` and :mod:`hmt.serve.http.bodies`: .npy, JSON, JPEG/PNG, uint8
pixels, multipart forms, batches; 400/413/415/422; images, JSON, forms and /v2 requests in a
decoding lane of one thread, .npy on the inference pool) and the inference on a thread pool
(or, opt-in, the dynamic batcher), under a per-request deadline (504; a request still waiting
in the queue at its deadline is dropped without running). The event loop only reads bodies and
answers: 8 clients sending PNGs or 1 MiB JSON bodies no longer stall everyone else's requests,
and a flood of them meets the queue limit before it costs any decoding.

**Latency.** A request's span runs from its first byte in (stamped by the connection
layer) to its last byte out. The server's part before compute (queueing and decoding,
from the body's last byte) is handed to :meth:`Controller.predict` as ``queued_ms``, so
the loop's latency and budget include it; receipt is not (a slow sender's pace says
nothing about the variant: counting it moved a normal client's answers to smaller
variants). The deadline still runs from the first byte. The whole span, and the latency
a client reports for its previous request (header ``X-HMT-Client-Latency-Ms``, sent by
:mod:`hmt.client`; only where plausible, :mod:`hmt.serve.http.client_reports`), are kept in
``/v1/status`` and ``/metrics``, and passed to ``controller.observe_request(span_ms,
client_ms)`` when the controller has that method.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hmt.serve.controller import Controller, Prediction
from hmt.serve.http.answers import AnswerOptions, answer_options, prediction_json
from hmt.serve.http.bodies import MULTIPART_MEDIA_TYPE, decode_request
from hmt.serve.http.client_reports import ClientReports
from hmt.serve.http.connections import FIRST_BYTE_KEY
from hmt.serve.http.guard import (
    CLIENT_MS_KEY,
    ASGIApp,
    Guard,
    error_response,
    incident_message,
    internal_error,
)
from hmt.serve.http.inputs import (
    IMAGE_MEDIA_TYPES,
    JSON_MEDIA_TYPE,
    NPY_MEDIA_TYPE,
    ApiError,
    InputSpec,
    as_items,
)
from hmt.serve.http.oip import INFER_LABEL as V2_INFER_LABEL
from hmt.serve.http.oip import PREFIX as V2_PREFIX
from hmt.serve.http.oip import OipContext, oip_routes
from hmt.serve.http.oip import error_response as v2_error_response
from hmt.serve.http.service import ApiOptions, InferenceService, Prepare
from hmt.serve.reporting.exposition import openapi_document
from hmt.serve.reporting.http_metrics import LatencyWindow
from hmt.serve.reporting.inference_stats import InferenceStats
from hmt.serve.reporting.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from hmt.serve.reporting.metrics import ServeMetrics
from hmt.serve.running.batching import BatchingOptions

__all__ = ["JSON_MEDIA_TYPE", "NPY_MEDIA_TYPE", "ApiError", "ApiOptions", "create_app", "error_response"]

DEADLINE_HEADER = "x-deadline-ms"
CLIENT_LATENCY_HEADER = "x-hmt-client-latency-ms"
# Bodies whose decoding can cost far more than their size (a 56 KB PNG of 4,000 x 4,000 pixels,
# a 1 MiB JSON list, a form holding either): decoded in a lane of their own before inference.
HEAVY_MEDIA_TYPES = (JSON_MEDIA_TYPE, MULTIPART_MEDIA_TYPE, *IMAGE_MEDIA_TYPES)
HEALTH_PREFIX = "/v1/health/"
HEALTH_PREFIXES = (HEALTH_PREFIX, "/v2/health/")

logger = logging.getLogger("hmt.serve.http.api")


# -- the body ----------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError as exc:
            raise ApiError(400, "bad_content_length", f"Content-Length {declared!r} is not an integer") from exc
        if size > limit:
            raise ApiError(413, "body_too_large", f"body of {size} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _header_ms(request: Request, name: str, code: str) -> float | None:
    """A positive, finite millisecond header, or None when absent; 400 ``code`` when malformed."""
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ApiError(400, code, f"{name} {raw[:32]!r} is not a number") from exc
    if not (math.isfinite(value) and 0 < value < 1e7):
        raise ApiError(400, code, f"{name} must be a number of ms in (0, 1e7), got {raw[:32]!r}")
    return value


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` with every failure answered as a JSON error: one bad request never takes the server down."""
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.message, exc.headers)
        except ClientDisconnect:
            # The client left, or the connection layer cut it (receipt deadline, shutdown) and
            # already answered; nobody reads this, and it is not a server fault to log.
            return error_response(400, "client_disconnected", "the client disconnected")
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
            return internal_error(exc)

    return wrapped


_PATH_SHOWN_CHARS = 200  # a wrong path is echoed in its error at most this long (uvicorn admits paths of 64 KiB)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404, 405, 500) in the dialect of the path: /v1 JSON or /v2 (OIP)."""
    v2 = request.url.path.startswith(V2_PREFIX)
    if not isinstance(exc, HTTPException) or exc.status_code >= 500:
        return v2_error_response(500, incident_message(exc)) if v2 else internal_error(exc)
    status = exc.status_code
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    # 405 carries Allow (RFC 9110 15.5.6); the route put it in the exception's headers.
    path = request.url.path
    shown = path if len(path) <= _PATH_SHOWN_CHARS else f"{path[:_PATH_SHOWN_CHARS]}... ({len(path)} characters)"
    message = f"{request.method[:16]} {shown}: {exc.detail}"
    headers = dict(exc.headers) if exc.headers else None
    return v2_error_response(status, message, headers) if v2 else error_response(status, code, message, headers)


@_guarded
async def _live(request: Request) -> Response:
    return JSONResponse({"status": "live"})


class _Endpoints:
    """The state the endpoints share (service, counters, latency windows) and the /v1 handlers."""

    def __init__(self, controller: Controller, opts: ApiOptions) -> None:
        self.controller = controller
        self.opts = opts
        self.service = InferenceService(controller, opts)
        self.bundle_spec = controller.bundle.spec
        self.inputs = InputSpec.of_bundle(self.bundle_spec, max_batch=opts.max_batch,
                                          max_pixels=opts.max_image_pixels)
        self.body_limit = opts.body_limit(self.bundle_spec.input)
        self.counts: Counter[tuple[str, int]] = Counter()
        self.draining = threading.Event()
        self.spans = LatencyWindow()
        self.client_latency = LatencyWindow()
        self.reports = ClientReports()  # which X-HMT-Client-Latency-Ms values are plausible
        self.inference_stats = InferenceStats()  # /v2's statistics extension
        self.observe = getattr(controller, "observe_request", None)
        self.metrics_registry = ServeMetrics(controller, http_counts=self.counts, queue=self.queue_state,
                                             client_reports=self.reports)
        self.guard: Guard | None = None  # set once the app is wrapped; its connection counts go to status
        self.predict = _guarded(self._predict)
        self.ready = _guarded(self._ready)
        self.status = _guarded(self._status)
        self.metrics = _guarded(self._metrics)
        self.openapi = _guarded(self._openapi)

    def queue_state(self) -> dict[str, int]:
        service = self.service
        return {"admitted": service.admitted, "max_queue": self.opts.max_queue,
                "rejected_full": service.rejected_full, "deadline_expired": service.deadline_expired}

    async def submit(self, prepare: Prepare, first_byte_s: float, deadline_ms: float, received_s: float | None = None,
                     heavy: bool = False, tightened_ms: Callable[[], float | None] | None = None) -> list[Prediction]:
        try:
            results = await self.service.submit(prepare, first_byte_s, deadline_ms, received_s, heavy, tightened_ms)
        except Exception:
            self.inference_stats.failed(time.monotonic() - first_byte_s)
            raise
        self.inference_stats.answered(results, time.monotonic() - first_byte_s)
        self.metrics_registry.observe_predictions(results)
        return results

    def on_span(self, label: str, span_ms: float, reported_ms: float | None, connection: Hashable | None) -> None:
        self.spans.add(span_ms)
        client_ms = self.reports.answered(connection, span_ms, reported_ms)  # None unless plausible
        self.metrics_registry.observe_request("v2" if label == V2_INFER_LABEL else "v1", span_ms, client_ms)
        if client_ms is not None:
            self.client_latency.add(client_ms)
        if callable(self.observe):  # the controller's own record of whole-request latency, where it keeps one
            try:
                self.observe(span_ms=span_ms, client_ms=client_ms)
            except Exception:
                logger.exception("controller.observe_request failed")

    async def _predict(self, request: Request) -> Response:
        first_byte_s = float(request.scope["extensions"][FIRST_BYTE_KEY])
        if self.draining.is_set():
            raise ApiError(503, "shutting_down", "the server is shutting down")
        if not self.controller.ready:
            raise ApiError(503, "not_ready", "no variant is loaded and warm yet", headers={"Retry-After": "1"})
        deadline_ms = self.opts.deadline_ms
        asked = _header_ms(request, DEADLINE_HEADER, "bad_deadline")
        if asked is not None:
            deadline_ms = min(deadline_ms, asked)
        client_ms = _header_ms(request, CLIENT_LATENCY_HEADER, "bad_client_latency")
        if client_ms is not None:
            request.scope["extensions"][CLIENT_MS_KEY] = client_ms
        body = await read_body(request, self.body_limit)
        received_s = time.monotonic()
        content_type = request.headers.get("content-type")
        answers: list[AnswerOptions] = []
        bundle_spec, inputs = self.bundle_spec, self.inputs

        def prepare() -> list[np.ndarray]:  # off the event loop, admitted to the queue first
            batch, fields = decode_request(body, content_type, inputs)
            answers.append(answer_options(request.query_params, fields, bundle_spec.classes))
            return as_items(batch, inputs)

        media = (content_type or "").split(";")[0].strip().lower()
        results = await self.submit(prepare, first_byte_s, deadline_ms, received_s, heavy=media in HEAVY_MEDIA_TYPES)
        answer = answers[0]
        names = bundle_spec.class_names
        if len(results) == 1:
            return JSONResponse(prediction_json(results[0], names, answer))
        return JSONResponse({"predictions": [prediction_json(r, names, answer) for r in results],
                             "batch": len(results)})

    async def _ready(self, request: Request) -> Response:
        if self.draining.is_set():
            return error_response(503, "shutting_down", "the server is shutting down")
        if not self.controller.ready:
            return error_response(503, "not_ready", "no variant is loaded and warm yet")
        return JSONResponse({"status": "ready", "variant": self.controller.active_arch_id})

    async def _status(self, request: Request) -> Response:
        service, opts = self.service, self.opts
        doc = self.controller.status()
        doc["batching"] = service.batcher.status() if service.batcher is not None else {"enabled": False}
        doc["queue"] = {"admitted": service.admitted, "max_queue": opts.max_queue, "workers": opts.workers,
                        "rejected_full": service.rejected_full, "deadline_expired": service.deadline_expired}
        connections = self.guard.connection_stats.to_json_dict() if self.guard is not None else None
        doc["http"] = {"connections": connections, "request_span_ms": self.spans.summary(),
                       "client_latency_ms": self.client_latency.summary(),
                       "client_reports": self.reports.to_json_dict()}
        # Every serve setting's effective value and its source (default, serve.json, --serve-config, ...).
        doc["settings"] = getattr(self.controller, "settings_report", None)
        return JSONResponse(json.loads(json.dumps(doc, default=_jsonable)))

    async def _metrics(self, request: Request) -> Response:
        # Rendering reads /proc and every collector: off the event loop, like an inference.
        text = await asyncio.get_running_loop().run_in_executor(None, self.metrics_registry.text)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(self.bundle_spec.input, self.body_limit, auth=self.opts.token is not None))

    def oip(self, model_name: str) -> OipContext:
        """What the /v2 routes share with these."""
        return OipContext(
            self.controller, self.inputs, model_name, self.draining, self.opts.deadline_ms,
            read_body=lambda request: read_body(request, self.body_limit), body_limit=self.body_limit,
            submit=self.submit, stats=self.inference_stats,
            batching=BatchingOptions(self.opts.dynamic_batch, self.opts.dynamic_batch_delay_ms),
            deadline_header=lambda request: _header_ms(request, DEADLINE_HEADER, "bad_deadline"),
            first_byte_s=lambda request: float(request.scope["extensions"][FIRST_BYTE_KEY]),
            internal_error=incident_message)


def create_app(controller: Controller, options: ApiOptions | None = None,
               on_shutdown: Callable[[], None] | None = None) -> ASGIApp:
    """The ASGI app. ``on_shutdown`` runs after the last in-flight request has finished."""
    opts = options if options is not None else ApiOptions()
    ends = _Endpoints(controller, opts)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        ends.draining.set()
        await asyncio.get_running_loop().run_in_executor(None, ends.service.shutdown)
        if on_shutdown is not None:
            on_shutdown()

    app = Starlette(
        routes=[
            Route("/v1/predict", ends.predict, methods=["POST"]),
            Route("/v1/health/live", _live, methods=["GET"]),
            Route("/v1/health/ready", ends.ready, methods=["GET"]),
            Route("/v1/status", ends.status, methods=["GET"]),
            Route("/metrics", ends.metrics, methods=["GET"]),
            Route("/openapi.json", ends.openapi, methods=["GET"]),
            *oip_routes(ends.oip(opts.model_name or model_name_of(controller))),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    # No redirect from /v1/status/ to /v1/status: starlette builds its Location from the
    # client's Host header. A wrong path is a 404.
    app.router.redirect_slashes = False
    app.state.service = ends.service
    app.state.draining = ends.draining
    guard = Guard(app, opts.token, ends.counts, open_prefixes=HEALTH_PREFIXES if opts.health_without_token else (),
                  on_span=ends.on_span)
    ends.guard = guard
    ends.metrics_registry.status.connections = guard.connection_stats  # filled by the server's connection layer
    return guard


def model_name_of(controller: Any) -> str:
    """The bundle directory's name, as the /v2 model name (characters outside [A-Za-z0-9._-] as ``_``)."""
    root = getattr(getattr(controller, "bundle", None), "root", None)
    name = getattr(root, "name", "") or "hmt"
    return "".join(ch if ch.isascii() and (ch.isalnum() or ch in "._-") else "_" for ch in name)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
