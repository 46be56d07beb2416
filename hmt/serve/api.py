"""The inference API: a starlette app over a :class:`~hmt.serve.controller.Controller`.

Endpoints (see :func:`hmt.serve.exposition.openapi_document`): ``POST /v1/predict``,
``GET /v1/health/live``, ``GET /v1/health/ready``, ``GET /v1/status``, ``GET /metrics``,
``GET /openapi.json``. Every error is JSON ``{"error": {"code", "message"}}``; a 500 says
only that it happened (with an id to find it in the log), never the exception's text.

Guards, in request order (below the app, :mod:`hmt.serve.connections` caps connections
and bounds how long a request may take to arrive): the bearer token (when one is set, on
every path but, with ``health_without_token``, ``/v1/health/*``; constant-time compare);
readiness (503); the body bound (``Content-Length`` first, then the streamed bytes, 413);
decoding (:mod:`hmt.serve.inputs`: .npy, JSON, JPEG/PNG, uint8 pixels, batches; 400/413/
415/422); admission to a bounded queue (429 when full); then the inference runs on a
thread pool (the event loop only parses and answers) under a per-request deadline (504; a
request still waiting in the queue at its deadline is dropped without running).

**Latency.** A request's span runs from its first byte in (stamped by the connection
layer) to its last byte out. The part before compute (receipt, parsing, queueing) is
handed to :meth:`Controller.predict` as ``queued_ms``, so the loop's latency and budget
include it; the whole span, and the latency a client reports for its previous request
(header ``X-HMT-Client-Latency-Ms``, sent by :mod:`hmt.client`), are kept in
``/v1/status`` and ``/metrics``, and passed to ``controller.observe_request(span_ms,
client_ms)`` when the controller has that method.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import math
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hmt.bundle import TensorSpec
from hmt.errors import DeviceError, ModelError, UsageError
from hmt.serve.answers import answer_options, prediction_json
from hmt.serve.batching import BatchingOptions, DeadlinePassed, DynamicBatcher
from hmt.serve.bodies import decode_request
from hmt.serve.connections import FIRST_BYTE_KEY, ConnectionStats
from hmt.serve.controller import Controller, Prediction
from hmt.serve.exposition import openapi_document
from hmt.serve.inputs import (
    JSON_MEDIA_TYPE,
    NPY_MEDIA_TYPE,
    ApiError,
    InputSpec,
    as_items,
)
from hmt.serve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from hmt.serve.metrics import ServeMetrics
from hmt.serve.oip import INFER_LABEL as V2_INFER_LABEL
from hmt.serve.oip import PREFIX as V2_PREFIX
from hmt.serve.oip import OipContext, oip_routes, route_label
from hmt.serve.oip import error_response as v2_error_response

__all__ = ["JSON_MEDIA_TYPE", "NPY_MEDIA_TYPE", "ApiError", "ApiOptions", "create_app"]

DEADLINE_HEADER = "x-deadline-ms"
CLIENT_LATENCY_HEADER = "x-hmt-client-latency-ms"
HEALTH_PREFIX = "/v1/health/"
HEALTH_PREFIXES = (HEALTH_PREFIX, "/v2/health/")
_WINDOW = 2048
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger("hmt.serve.api")


@dataclass(frozen=True)
class ApiOptions:
    """HTTP-side limits. ``max_body_bytes=None``: derived from the input spec (room for JSON text)."""

    token: str | None = None
    max_body_bytes: int | None = None
    max_queue: int = 64
    workers: int = 2
    deadline_ms: float = 2000.0
    health_without_token: bool = False  # let /v1/health/* through without the token (orchestrator probes)
    max_batch: int = 64  # inputs per request
    max_image_pixels: int = 4096 * 4096  # width x height of an encoded image, checked before decoding
    model_name: str | None = None  # the model's name on /v2 (None: the bundle directory's name)
    dynamic_batch: int = 1  # inputs run together by the dynamic batcher (hmt.serve.batching); 1: off
    dynamic_batch_delay_ms: float = 2.0

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise UsageError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.workers < 1:
            raise UsageError(f"workers must be >= 1, got {self.workers}")
        if not (math.isfinite(self.deadline_ms) and self.deadline_ms > 0):
            raise UsageError(f"deadline_ms must be a finite number > 0, got {self.deadline_ms}")
        if self.max_body_bytes is not None and self.max_body_bytes < 64:
            raise UsageError(f"max_body_bytes must be >= 64, got {self.max_body_bytes}")
        if self.max_batch < 1:
            raise UsageError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_image_pixels < 1:
            raise UsageError(f"max_image_pixels must be >= 1, got {self.max_image_pixels}")
        BatchingOptions(self.dynamic_batch, self.dynamic_batch_delay_ms)  # refuses bad values

    def body_limit(self, spec: TensorSpec) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        numel = math.prod(spec.shape)
        # JSON spells a float in up to ~25 characters; .npy needs the raw bytes + a header.
        return max(1 << 20, 32 * numel + 4096)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def incident_message(exc: BaseException) -> str:
    """What a 500 tells the client (nothing internal); the log has the traceback under the same id."""
    incident = secrets.token_hex(4)
    logger.error("internal error %s", incident, exc_info=exc)
    return f"internal error (id {incident}); the server log has the details"


def internal_error(exc: BaseException) -> JSONResponse:
    return error_response(500, "internal_error", incident_message(exc))


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


# -- admission and execution ---------------------------------------------------------------------


class _DeadlinePassed(Exception):
    pass


class InferenceService:
    """A bounded queue in front of a thread pool running :meth:`Controller.predict`.

    One admitted request holds one queue slot and one worker for all of its inputs (a
    batch runs item by item: the bundle's graphs take a batch of one).
    """

    def __init__(self, controller: Controller, options: ApiOptions) -> None:
        self.controller = controller
        self.options = options
        self._executor = concurrent.futures.ThreadPoolExecutor(options.workers, thread_name_prefix="hmt-infer")
        batching = BatchingOptions(options.dynamic_batch, options.dynamic_batch_delay_ms)
        self.batcher = DynamicBatcher(controller, batching, options.workers) if batching.enabled else None
        self._lock = threading.Lock()
        self.admitted = 0
        self.rejected_full = 0
        self.deadline_expired = 0

    def _release(self, _future: concurrent.futures.Future[list[Prediction]]) -> None:
        with self._lock:
            self.admitted -= 1

    def _work(self, items: list[np.ndarray], first_byte_s: float, deadline_s: float) -> list[Prediction]:
        start_s = time.monotonic()
        if start_s > deadline_s:
            raise _DeadlinePassed()
        # Everything before compute (receipt, parsing, queueing) is the request's overhead:
        # every item of a batch carries it, plus its own compute.
        overhead_ms = (start_s - first_byte_s) * 1e3
        return [self.controller.predict(x, queued_ms=overhead_ms) for x in items]

    async def submit(self, items: list[np.ndarray], first_byte_s: float, deadline_ms: float) -> list[Prediction]:
        with self._lock:
            if self.admitted >= self.options.max_queue:
                self.rejected_full += 1
                raise ApiError(429, "queue_full", f"{self.admitted} requests are queued or running "
                                                  f"(limit {self.options.max_queue}); retry later",
                               headers={"Retry-After": "1"})
            self.admitted += 1
        deadline_s = first_byte_s + deadline_ms / 1e3
        try:
            if self.batcher is not None:
                future = self.batcher.submit(items, first_byte_s, deadline_s)
            else:
                future = self._executor.submit(self._work, items, first_byte_s, deadline_s)
        except RuntimeError as exc:  # the pool is shutting down
            with self._lock:
                self.admitted -= 1
            raise ApiError(503, "shutting_down", "the server is shutting down") from exc
        future.add_done_callback(self._release)
        try:
            # Cancelling the wrapper on timeout also cancels the job if it has not started.
            return await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline_s - time.monotonic()))
        except (asyncio.TimeoutError, _DeadlinePassed, DeadlinePassed) as exc:
            self.deadline_expired += 1
            raise ApiError(504, "deadline_exceeded", f"no answer within the deadline of {deadline_ms:g} ms "
                                                     "(counted from the request's first byte)") from exc
        except ModelError as exc:
            # The input passed every check, so a chain that cannot answer it (non-finite logits
            # from finite inputs like 3e38) is the input's range, not a server fault.
            logger.info("model refused an input: %s", exc)
            peak = max(float(np.max(np.abs(x))) for x in items) if items else 0.0
            raise ApiError(422, "input_out_of_range", f"the model gives no finite answer for this input (largest "
                                                      f"|value| {peak:.3g}); send inputs in the model's range, "
                                                      "e.g. normalised pixels") from exc
        except DeviceError as exc:
            logger.warning("inference unavailable: %s", exc)
            raise ApiError(503, "unavailable", "no variant can answer right now; retry",
                           headers={"Retry-After": "1"}) from exc

    def shutdown(self) -> None:
        """Finish every admitted request, then stop the pool."""
        if self.batcher is not None:
            self.batcher.shutdown()
        self._executor.shutdown(wait=True)


class LatencyWindow:
    """Recent values (ms) and their running count/sum, thread-safe, for status and metrics."""

    def __init__(self, size: int = _WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()
        self.count = 0
        self.sum_ms = 0.0

    def add(self, value_ms: float) -> None:
        with self._lock:
            self._values.append(value_ms)
            self.count += 1
            self.sum_ms += value_ms

    def summary(self) -> dict[str, float] | None:
        with self._lock:
            values = np.array(self._values, dtype=np.float64)
            count, total = self.count, self.sum_ms
        if not values.size:
            return None
        return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
                "p99": float(np.percentile(values, 99)), "count": count, "sum": total}


# -- the app ---------------------------------------------------------------------------------


class _Guard:
    """Pure ASGI middleware: the bearer token, response counts by path and status, and each
    prediction's whole span (first byte in to last byte out)."""

    def __init__(self, app: ASGIApp, token: str | None, counts: Counter[tuple[str, int]], *,
                 open_prefixes: tuple[str, ...], on_span: Callable[[str, float, float | None], None]) -> None:
        self.app = app
        self.token = None if token is None else token.encode()
        self.counts = counts
        self.open_prefixes = open_prefixes
        self.on_span = on_span
        self.connection_stats = ConnectionStats()  # shared with ApiServer, which fills it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extensions = scope.setdefault("extensions", {})
        # Under uvicorn the connection layer stamped the first byte; elsewhere (tests) it is now.
        first_byte_s = extensions.setdefault(FIRST_BYTE_KEY, time.monotonic())
        path = scope.get("path", "")
        v2 = path == V2_PREFIX or path.startswith(V2_PREFIX + "/")
        label = route_label(path) if v2 else path if path in _KNOWN_PATHS else "other"
        if self.token is not None and not (self.open_prefixes and path.startswith(self.open_prefixes)):
            supplied = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    supplied = value
                    break
            scheme, _, credential = supplied.partition(b" ")
            # compare_digest on both the scheme check and the token keeps timing independent of content.
            ok = hmac.compare_digest(scheme.lower(), b"bearer") & hmac.compare_digest(credential.strip(), self.token)
            if not ok:
                self.counts[(label, 401)] += 1
                challenge = {"WWW-Authenticate": "Bearer"}
                response = v2_error_response(401, "missing or wrong bearer token", challenge) if v2 else \
                    error_response(401, "unauthorized", "missing or wrong bearer token", headers=challenge)
                await response(scope, receive, send)
                return
        status = [0]

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                self.counts[(label, status[0])] += 1
            await send(message)
            if (message["type"] == "http.response.body" and not message.get("more_body")
                    and label in _SPAN_LABELS and status[0] == 200):
                # The last byte is handed to the transport: the request's whole server-side span.
                self.on_span(label, (time.monotonic() - first_byte_s) * 1e3, extensions.get(_CLIENT_MS_KEY))

        await self.app(scope, receive, counting_send)


_KNOWN_PATHS = ("/v1/predict", "/v1/health/live", "/v1/health/ready", "/v1/status", "/metrics", "/openapi.json")
_SPAN_LABELS = ("/v1/predict", V2_INFER_LABEL)
_CLIENT_MS_KEY = "hmt.client_latency_ms"


def create_app(controller: Controller, options: ApiOptions | None = None,
               on_shutdown: Callable[[], None] | None = None) -> ASGIApp:
    """The ASGI app. ``on_shutdown`` runs after the last in-flight request has finished."""
    opts = options if options is not None else ApiOptions()
    service = InferenceService(controller, opts)
    bundle_spec = controller.bundle.spec
    spec = bundle_spec.input
    inputs = InputSpec.of_bundle(bundle_spec, max_batch=opts.max_batch, max_pixels=opts.max_image_pixels)
    body_limit = opts.body_limit(spec)
    model_name = opts.model_name or model_name_of(controller)
    counts: Counter[tuple[str, int]] = Counter()
    draining = threading.Event()
    spans = LatencyWindow()
    client_latency = LatencyWindow()
    observe = getattr(controller, "observe_request", None)

    def queue_state() -> dict[str, int]:
        return {"admitted": service.admitted, "max_queue": opts.max_queue, "rejected_full": service.rejected_full,
                "deadline_expired": service.deadline_expired}

    metrics_registry = ServeMetrics(controller, http_counts=counts, queue=queue_state)

    async def submit(items: list[np.ndarray], first_byte_s: float, deadline_ms: float) -> list[Prediction]:
        results = await service.submit(items, first_byte_s, deadline_ms)
        metrics_registry.observe_predictions(results)
        return results

    def on_span(label: str, span_ms: float, client_ms: float | None) -> None:
        metrics_registry.observe_request("v2" if label == V2_INFER_LABEL else "v1", span_ms, client_ms)
        spans.add(span_ms)
        if client_ms is not None:
            client_latency.add(client_ms)
        if callable(observe):  # the controller's own record of whole-request latency, where it keeps one
            try:
                observe(span_ms=span_ms, client_ms=client_ms)
            except Exception:
                logger.exception("controller.observe_request failed")

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
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

    @guarded
    async def predict(request: Request) -> Response:
        first_byte_s = float(request.scope["extensions"][FIRST_BYTE_KEY])
        if draining.is_set():
            raise ApiError(503, "shutting_down", "the server is shutting down")
        if not controller.ready:
            raise ApiError(503, "not_ready", "no variant is loaded and warm yet", headers={"Retry-After": "1"})
        deadline_ms = opts.deadline_ms
        asked = _header_ms(request, DEADLINE_HEADER, "bad_deadline")
        if asked is not None:
            deadline_ms = min(deadline_ms, asked)
        client_ms = _header_ms(request, CLIENT_LATENCY_HEADER, "bad_client_latency")
        if client_ms is not None:
            request.scope["extensions"][_CLIENT_MS_KEY] = client_ms
        body = await read_body(request, body_limit)
        batch, fields = decode_request(body, request.headers.get("content-type"), inputs)
        answer = answer_options(request.query_params, fields, bundle_spec.classes)
        results = await submit(as_items(batch, inputs), first_byte_s, deadline_ms)
        names = bundle_spec.class_names
        if len(results) == 1:
            return JSONResponse(prediction_json(results[0], names, answer))
        return JSONResponse({"predictions": [prediction_json(r, names, answer) for r in results],
                             "batch": len(results)})

    @guarded
    async def live(request: Request) -> Response:
        return JSONResponse({"status": "live"})

    @guarded
    async def ready(request: Request) -> Response:
        if draining.is_set():
            return error_response(503, "shutting_down", "the server is shutting down")
        if not controller.ready:
            return error_response(503, "not_ready", "no variant is loaded and warm yet")
        return JSONResponse({"status": "ready", "variant": controller.active_arch_id})

    @guarded
    async def status(request: Request) -> Response:
        doc = controller.status()
        doc["batching"] = service.batcher.status() if service.batcher is not None else {"enabled": False}
        doc["queue"] = {"admitted": service.admitted, "max_queue": opts.max_queue, "workers": opts.workers,
                        "rejected_full": service.rejected_full, "deadline_expired": service.deadline_expired}
        doc["http"] = {"connections": guard.connection_stats.to_json_dict(), "request_span_ms": spans.summary(),
                       "client_latency_ms": client_latency.summary()}
        # Every serve setting's effective value and its source (default, serve.json, --serve-config, ...).
        doc["settings"] = getattr(controller, "settings_report", None)
        return JSONResponse(json.loads(json.dumps(doc, default=_jsonable)))

    @guarded
    async def metrics(request: Request) -> Response:
        # Rendering reads /proc and every collector: off the event loop, like an inference.
        text = await asyncio.get_running_loop().run_in_executor(None, metrics_registry.text)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    @guarded
    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(spec, body_limit, auth=opts.token is not None))

    async def http_error(request: Request, exc: Exception) -> Response:
        v2 = request.url.path.startswith(V2_PREFIX)
        if not isinstance(exc, HTTPException) or exc.status_code >= 500:
            return v2_error_response(500, incident_message(exc)) if v2 else internal_error(exc)
        status = exc.status_code
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        # 405 carries Allow (RFC 9110 15.5.6); the route put it in the exception's headers.
        message = f"{request.method} {request.url.path}: {exc.detail}"
        headers = dict(exc.headers) if exc.headers else None
        return v2_error_response(status, message, headers) if v2 else error_response(status, code, message, headers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        draining.set()
        await asyncio.get_running_loop().run_in_executor(None, service.shutdown)
        if on_shutdown is not None:
            on_shutdown()

    app = Starlette(
        routes=[
            Route("/v1/predict", predict, methods=["POST"]),
            Route("/v1/health/live", live, methods=["GET"]),
            Route("/v1/health/ready", ready, methods=["GET"]),
            Route("/v1/status", status, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            *oip_routes(OipContext(
                controller, inputs, model_name, draining, opts.deadline_ms,
                read_body=lambda request: read_body(request, body_limit), submit=submit,
                deadline_header=lambda request: _header_ms(request, DEADLINE_HEADER, "bad_deadline"),
                first_byte_s=lambda request: float(request.scope["extensions"][FIRST_BYTE_KEY]),
                internal_error=incident_message)),
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    # No redirect from /v1/status/ to /v1/status: starlette builds its Location from the
    # client's Host header. A wrong path is a 404.
    app.router.redirect_slashes = False
    app.state.service = service
    app.state.draining = draining
    guard = _Guard(app, opts.token, counts, open_prefixes=HEALTH_PREFIXES if opts.health_without_token else (),
                   on_span=on_span)
    metrics_registry.status.connections = guard.connection_stats  # filled by the server's connection layer
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
