"""The inference API: a starlette app over a :class:`~hmt.serve.controller.Controller`.

Endpoints (see :func:`hmt.serve.exposition.openapi_document`): ``POST /v1/predict``,
``GET /v1/health/live``, ``GET /v1/health/ready``, ``GET /v1/status``, ``GET /metrics``,
``GET /openapi.json``. Every error is JSON ``{"error": {"code", "message"}}``.

Guards, in request order: the bearer token (when one is set, on every path, compared in
constant time); readiness (503); the body bound (``Content-Length`` first, then the
streamed bytes, 413); the tensor's encoding, dtype, shape and finiteness against the
bundle's input spec (400/415/422); admission to a bounded queue (429 when full); then
the inference runs on a thread pool (the event loop only parses and answers) under a
per-request deadline (504; a request still waiting in the queue at its deadline is
dropped without running).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import io
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hmt.bundle import TensorSpec
from hmt.errors import HmtError, UsageError
from hmt.serve.controller import Controller, Prediction
from hmt.serve.exposition import openapi_document, prometheus_text
from hmt.serve.runner import numpy_dtype

NPY_MEDIA_TYPE = "application/x-npy"
JSON_MEDIA_TYPE = "application/json"
DEADLINE_HEADER = "x-deadline-ms"
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class ApiOptions:
    """HTTP-side limits. ``max_body_bytes=None``: derived from the input spec (room for JSON text)."""

    token: str | None = None
    max_body_bytes: int | None = None
    max_queue: int = 64
    workers: int = 2
    deadline_ms: float = 2000.0

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise UsageError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.workers < 1:
            raise UsageError(f"workers must be >= 1, got {self.workers}")
        if not (math.isfinite(self.deadline_ms) and self.deadline_ms > 0):
            raise UsageError(f"deadline_ms must be a finite number > 0, got {self.deadline_ms}")
        if self.max_body_bytes is not None and self.max_body_bytes < 64:
            raise UsageError(f"max_body_bytes must be >= 64, got {self.max_body_bytes}")

    def body_limit(self, spec: TensorSpec) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        numel = math.prod(spec.shape)
        # JSON spells a float in up to ~25 characters; .npy needs the raw bytes + a header.
        return max(1 << 20, 32 * numel + 4096)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


# -- the tensor ------------------------------------------------------------------------------


def _reject_constant(name: str) -> float:
    raise ApiError(422, "non_finite", f"inputs contain {name}; only finite numbers are accepted")


def parse_tensor(body: bytes, content_type: str | None, spec: TensorSpec) -> np.ndarray:
    """The request body as an array of the input spec's dtype and shape, or an :class:`ApiError`."""
    media = (content_type or "").split(";")[0].strip().lower()
    dtype = numpy_dtype(spec.dtype)
    if not body:
        raise ApiError(400, "empty_body", "the request body is empty; send a .npy tensor or JSON {\"inputs\": [...]}")
    if media == NPY_MEDIA_TYPE:
        try:
            array = np.load(io.BytesIO(body), allow_pickle=False)
        except Exception as exc:
            raise ApiError(400, "bad_npy", f"body is not a valid .npy array ({type(exc).__name__}: {exc})") from exc
        if not isinstance(array, np.ndarray):
            raise ApiError(400, "bad_npy", "body is an .npz archive; send a single .npy array")
        if array.dtype != dtype:
            raise ApiError(422, "bad_dtype", f"input dtype is {array.dtype}; the bundle expects {spec.dtype}")
    elif media == JSON_MEDIA_TYPE:
        try:
            doc = json.loads(body, parse_constant=_reject_constant)
        except ApiError:
            raise
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "bad_json", f"body is not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or "inputs" not in doc:
            raise ApiError(422, "bad_json", 'expected a JSON object {"inputs": <nested list of numbers>}')
        try:
            wide = np.asarray(doc["inputs"], dtype=np.float64)
        except (ValueError, TypeError) as exc:
            raise ApiError(422, "bad_inputs", f"inputs must be a rectangular nested list of numbers ({exc})") from exc
        if not np.all(np.isfinite(wide)):
            raise ApiError(422, "non_finite", "inputs contain NaN or infinity; only finite numbers are accepted")
        if np.issubdtype(dtype, np.integer) and not np.all(wide == np.round(wide)):
            raise ApiError(422, "bad_dtype", f"the bundle expects {spec.dtype}; inputs hold non-integers")
        array = wide.astype(dtype)
    else:
        raise ApiError(415, "unsupported_media_type", f"content-type {media or '(none)'!r} is not supported; "
                                                      f"use {NPY_MEDIA_TYPE} or {JSON_MEDIA_TYPE}")
    expected = tuple(spec.shape)
    if array.shape != expected:
        if expected and expected[0] == 1 and array.shape == expected[1:]:
            array = array.reshape(expected)
        else:
            raise ApiError(422, "bad_shape", f"input shape is {list(array.shape)}; the bundle expects "
                                             f"{list(expected)} (or {list(expected[1:])} without the batch axis)")
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise ApiError(422, "non_finite", "input contains NaN or infinity; only finite numbers are accepted")
    return np.ascontiguousarray(array)


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


# -- admission and execution ---------------------------------------------------------------------


class _DeadlinePassed(Exception):
    pass


class InferenceService:
    """A bounded queue in front of a thread pool running :meth:`Controller.predict`."""

    def __init__(self, controller: Controller, options: ApiOptions) -> None:
        self.controller = controller
        self.options = options
        self._executor = concurrent.futures.ThreadPoolExecutor(options.workers, thread_name_prefix="hmt-infer")
        self._lock = threading.Lock()
        self.admitted = 0
        self.rejected_full = 0
        self.deadline_expired = 0

    def _release(self, _future: concurrent.futures.Future[Prediction]) -> None:
        with self._lock:
            self.admitted -= 1

    def _work(self, x: np.ndarray, received_s: float, deadline_s: float) -> Prediction:
        start_s = time.monotonic()
        if start_s > deadline_s:
            raise _DeadlinePassed()
        return self.controller.predict(x, queued_ms=(start_s - received_s) * 1e3)

    async def submit(self, x: np.ndarray, received_s: float, deadline_ms: float) -> Prediction:
        with self._lock:
            if self.admitted >= self.options.max_queue:
                self.rejected_full += 1
                raise ApiError(429, "queue_full", f"{self.admitted} requests are queued or running "
                                                  f"(limit {self.options.max_queue}); retry later",
                               headers={"Retry-After": "1"})
            self.admitted += 1
        deadline_s = received_s + deadline_ms / 1e3
        try:
            future = self._executor.submit(self._work, x, received_s, deadline_s)
        except RuntimeError as exc:  # the pool is shutting down
            with self._lock:
                self.admitted -= 1
            raise ApiError(503, "shutting_down", "the server is shutting down") from exc
        future.add_done_callback(self._release)
        try:
            # Cancelling the wrapper on timeout also cancels the job if it has not started.
            return await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline_s - time.monotonic()))
        except (asyncio.TimeoutError, _DeadlinePassed) as exc:
            self.deadline_expired += 1
            raise ApiError(504, "deadline_exceeded", f"no answer within the deadline of {deadline_ms:g} ms") from exc

    def shutdown(self) -> None:
        """Finish every admitted request, then stop the pool."""
        self._executor.shutdown(wait=True)


# -- the app ---------------------------------------------------------------------------------


class _Guard:
    """Pure ASGI middleware: bearer token on every HTTP request, and response counts by path and status."""

    def __init__(self, app: ASGIApp, token: str | None, counts: Counter[tuple[str, int]]) -> None:
        self.app = app
        self.token = None if token is None else token.encode()
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        label = path if path in _KNOWN_PATHS else "other"
        if self.token is not None:
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
                response = error_response(401, "unauthorized", "missing or wrong bearer token",
                                          headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counts[(label, int(message["status"]))] += 1
            await send(message)

        await self.app(scope, receive, counting_send)


_KNOWN_PATHS = ("/v1/predict", "/v1/health/live", "/v1/health/ready", "/v1/status", "/metrics", "/openapi.json")


def create_app(controller: Controller, options: ApiOptions | None = None,
               on_shutdown: Callable[[], None] | None = None) -> ASGIApp:
    """The ASGI app. ``on_shutdown`` runs after the last in-flight request has finished."""
    opts = options if options is not None else ApiOptions()
    service = InferenceService(controller, opts)
    spec = controller.bundle.spec.input
    body_limit = opts.body_limit(spec)
    counts: Counter[tuple[str, int]] = Counter()
    draining = threading.Event()

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message, exc.headers)
            except HmtError as exc:
                return error_response(500, type(exc).__name__, str(exc))
            except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
                return error_response(500, "internal_error", f"{type(exc).__name__}: {exc}")

        return wrapped

    @guarded
    async def predict(request: Request) -> Response:
        received_s = time.monotonic()
        if draining.is_set():
            raise ApiError(503, "shutting_down", "the server is shutting down")
        if not controller.ready:
            raise ApiError(503, "not_ready", "no variant is loaded and warm yet", headers={"Retry-After": "1"})
        deadline_ms = opts.deadline_ms
        asked = request.headers.get(DEADLINE_HEADER)
        if asked is not None:
            try:
                value = float(asked)
            except ValueError as exc:
                raise ApiError(400, "bad_deadline", f"{DEADLINE_HEADER} {asked!r} is not a number") from exc
            if not (math.isfinite(value) and value > 0):
                raise ApiError(400, "bad_deadline", f"{DEADLINE_HEADER} must be > 0 ms, got {asked!r}")
            deadline_ms = min(deadline_ms, value)
        body = await read_body(request, body_limit)
        x = parse_tensor(body, request.headers.get("content-type"), spec)
        result = await service.submit(x, received_s, deadline_ms)
        return JSONResponse({
            "class": result.class_index,
            "confidence": result.confidence,
            "exit": result.exit,
            "variant": result.variant,
            "latency_ms": result.latency_ms,
            "compute_ms": result.compute_ms,
            "over_budget": result.deadline_miss,
        })

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
        doc["queue"] = {"admitted": service.admitted, "max_queue": opts.max_queue, "workers": opts.workers,
                        "rejected_full": service.rejected_full, "deadline_expired": service.deadline_expired}
        return JSONResponse(json.loads(json.dumps(doc, default=_jsonable)))

    @guarded
    async def metrics(request: Request) -> Response:
        text = prometheus_text(controller, dict(counts), service.admitted, opts.max_queue)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @guarded
    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(spec, body_limit, auth=opts.token is not None))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        return error_response(status, code, f"{request.method} {request.url.path}: {detail}")

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
        ],
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.draining = draining
    return _Guard(app, opts.token, counts)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
