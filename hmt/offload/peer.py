"""The peer: ``hmt serve PEER_BUNDLE --role peer`` runs the tails of the variants for devices.

Endpoints (JSON errors ``{"error": {"code", "message"}}`` like the device API):

- ``POST /v1/segment?variant=ARCH&cut=K``: the body is the cut's tensor (:mod:`hmt.offload.codec`);
  optional ``x-deadline-ms`` (the device's share of its deadline: a request still queued
  then is dropped with 504), ``x-hmt-confidence`` (early exit threshold; absent: off) and
  ``x-hmt-graphs`` (the device's digest of the variant's graphs: 409 ``different_graphs``
  when the peer's differ, i.e. it serves another bundle's split).
  Answers ``{class, confidence, exit, probabilities, compute_ms, server_ms, queue_ms}``
  (``probabilities``: the answering exit's softmax, little-endian float32 in base64, so an
  offloaded answer serves ``top_k`` and ``probabilities`` as a local one does).
- ``POST /v1/probe``: up to :data:`PROBE_MAX_BYTES` of anything, answered with its size and
  the time spent reading it: the device's active bandwidth probe.
- ``GET /v1/status``: role, queue (admitted, limit, workers), CPU load, the running ratio
  of measured to warm compute time, and each variant's tail time per cut (warm, here),
  which is what the device plans with, and the digest of its graphs (``graphs_sha256``).
- ``GET /v1/health/live``, ``GET /v1/health/ready``.

Guards: below the app, the main server's connection layer (:mod:`hmt.serve.http.connections`,
run by :func:`hmt.offload.server.serve_peer`); the bearer token on every path when one is
set (constant-time compare), a body bound from the largest cut tensor, a bounded queue
(429), every tensor checked against its cut before it runs (4xx; one bad request never
takes the peer down). A finite tensor the tail cannot answer (non-finite logits from
values like 3e38) is the input's fault: 422 ``input_out_of_range``. A 500 says only that
it happened, with an id to find the traceback in the log, never the exception's text.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hmac
import json
import logging
import math
import secrets
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, MutableMapping

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hmt.bundle import Bundle
from hmt.errors import ModelError, UsageError
from hmt.offload.codec import CODECS, CodecError, decode
from hmt.offload.parts import SplitChain
from hmt.offload.plan import OffloadPlan
from hmt.serve.http.connections import ConnectionStats

CONFIDENCE_HEADER = "x-hmt-confidence"
DEADLINE_HEADER = "x-deadline-ms"
GRAPHS_HEADER = "x-hmt-graphs"
PROBE_MAX_BYTES = 1 << 20
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

logger = logging.getLogger("hmt.offload.peer")


@dataclass(frozen=True)
class PeerOptions:
    token: str | None = None
    max_queue: int = 32
    workers: int = 1
    deadline_ms: float = 2000.0

    def __post_init__(self) -> None:
        if self.max_queue < 1 or self.workers < 1:
            raise UsageError(f"peer max_queue and workers must be >= 1, got {self.max_queue}, {self.workers}")
        if not (math.isfinite(self.deadline_ms) and self.deadline_ms > 0):
            raise UsageError(f"peer deadline_ms must be a finite number > 0, got {self.deadline_ms}")


def encode_probabilities(probabilities: np.ndarray | None) -> str | None:
    """Little-endian float32 in base64 (4 bytes a class, exact), or None."""
    if probabilities is None:
        return None
    return base64.b64encode(np.asarray(probabilities, dtype="<f4").tobytes()).decode("ascii")


class _Rejected(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


class PeerService:
    """The tails of every variant of a bundle behind a bounded queue and a thread pool."""

    def __init__(self, bundle: Bundle, plan: OffloadPlan, options: PeerOptions, threads: int | None = 1,
                 warmup_runs: int = 5, engine: str = "auto") -> None:
        self.bundle = bundle
        self.options = options
        self.chains: dict[str, SplitChain] = {}
        rng = np.random.default_rng(0)
        x = rng.standard_normal(bundle.spec.input.shape).astype(np.float32)
        for variant in bundle.spec.variants:
            chain = SplitChain(bundle, variant, plan.for_variant(variant.arch_id), threads, engine)
            chain.warm_up(x, warmup_runs)
            self.chains[variant.arch_id] = chain
        self.body_limit = 4096 + max((4 * c.numel for ch in self.chains.values() for c in ch.cuts), default=0)
        self._executor = concurrent.futures.ThreadPoolExecutor(options.workers, thread_name_prefix="hmt-peer")
        self._lock = threading.Lock()
        self.admitted = 0
        self.served = 0
        self.rejected: Counter[str] = Counter()
        self.ratio = 1.0  # smoothed measured / warm compute time: the peer's own slowdown
        self.connection_stats = ConnectionStats()  # filled by the connection layer (serve_peer)

    def chain(self, arch_id: str | None, cut_text: str | None) -> tuple[SplitChain, int]:
        chain = self.chains.get(arch_id or "")
        if chain is None:
            raise _Rejected(404, "unknown_variant", f"variant {arch_id!r} is not in this peer's bundle")
        try:
            index = int(cut_text or "")
        except ValueError as exc:
            raise _Rejected(400, "bad_cut", f"query 'cut' must be an integer, got {cut_text!r}") from exc
        if not 0 <= index < len(chain.cuts):
            raise _Rejected(404, "unknown_cut", f"variant {arch_id!r} has cuts 0..{len(chain.cuts) - 1}, not {index}")
        return chain, index

    def _work(self, chain: SplitChain, index: int, t: np.ndarray, confidence: float | None,
              read_s: float, deadline_s: float) -> dict[str, Any]:
        start_s = time.monotonic()
        if start_s > deadline_s:
            raise _Rejected(504, "deadline_exceeded", "the request waited past its deadline in the peer's queue")
        cut = chain.cut(index)
        answer = chain.run_tail(t, cut, confidence)
        if answer.exit == chain.last:
            warm = chain.tail_time_ms(cut)
            sample = min(5.0, max(0.2, answer.compute_ms / warm))
            self.ratio += 0.2 * (sample - self.ratio)
        done_s = time.monotonic()
        # queue_ms and compute_ms start once the body is in: the device subtracts them from its
        # round trip and reads the rest as network time (the body's upload included).
        return {"class": answer.class_index, "confidence": answer.confidence, "exit": answer.exit,
                "probabilities": encode_probabilities(answer.probabilities),
                "compute_ms": answer.compute_ms, "queue_ms": (start_s - read_s) * 1e3,
                "server_ms": (done_s - read_s) * 1e3}

    async def submit(self, chain: SplitChain, index: int, t: np.ndarray, confidence: float | None,
                     received_s: float, deadline_ms: float) -> dict[str, Any]:
        read_s = time.monotonic()
        with self._lock:
            if self.admitted >= self.options.max_queue:
                self.rejected["queue_full"] += 1
                raise _Rejected(429, "queue_full", f"{self.admitted} segments queued or running "
                                                   f"(limit {self.options.max_queue})")
            self.admitted += 1
        deadline_s = received_s + deadline_ms / 1e3
        try:
            future = self._executor.submit(self._work, chain, index, t, confidence, read_s, deadline_s)
        except RuntimeError as exc:
            with self._lock:
                self.admitted -= 1
            raise _Rejected(503, "shutting_down", "the peer is shutting down") from exc
        future.add_done_callback(self._release)
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, deadline_s - time.monotonic()))
        except asyncio.TimeoutError as exc:
            raise _Rejected(504, "deadline_exceeded", f"no answer within {deadline_ms:g} ms") from exc
        self.served += 1
        return result

    def _release(self, _future: concurrent.futures.Future[dict[str, Any]]) -> None:
        with self._lock:
            self.admitted -= 1

    def status(self) -> dict[str, Any]:
        import psutil

        return {
            "role": "peer",
            "queue": {"admitted": self.admitted, "max_queue": self.options.max_queue,
                      "workers": self.options.workers, "served": self.served, "rejected": dict(self.rejected)},
            "load": {"cpu_util": psutil.cpu_percent(interval=None) / 100.0, "compute_ratio": self.ratio},
            "variants": {a: {"tail_ms": [ch.tail_time_ms(c) for c in ch.cuts], "engine": ch.engine,
                             "notes": ch.notes, "graphs_sha256": ch.graphs_sha256,
                             "cut_bytes_float32": [c.size_bytes("float32") for c in ch.cuts]}
                         for a, ch in self.chains.items()},
            "codecs": list(CODECS),
            "connections": self.connection_stats.to_json_dict(),
        }

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class _TokenGuard:
    """Bearer token on every HTTP request (constant-time compare), as the device API does."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = None if token is None else token.encode()
        self.connection_stats: ConnectionStats | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.token is not None:
            supplied = dict(scope.get("headers", ())).get(b"authorization", b"")
            scheme, _, credential = supplied.partition(b" ")
            ok = hmac.compare_digest(scheme.lower(), b"bearer") & hmac.compare_digest(credential.strip(), self.token)
            if not ok:
                await _error(401, "unauthorized", "missing or wrong bearer token",
                             {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _Rejected(413, "body_too_large", f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _Rejected(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _float_header(request: Request, name: str) -> float | None:
    text = request.headers.get(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError as exc:
        raise _Rejected(400, "bad_header", f"header {name} {text[:32]!r} is not a number") from exc
    if not (math.isfinite(value) and value > 0):
        raise _Rejected(400, "bad_header", f"header {name} must be a finite number > 0, got {text[:32]!r}")
    return value


def create_peer_app(service: PeerService) -> ASGIApp:
    """The peer's ASGI app over ``service`` (see the module docstring)."""
    opts = service.options

    def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except _Rejected as exc:
                service.rejected[exc.code] += 1
                return _error(exc.status, exc.code, exc.message)
            except CodecError as exc:
                service.rejected["bad_tensor"] += 1
                return _error(exc.status, "bad_tensor", str(exc))
            except ModelError as exc:
                # The tensor passed the codec's checks (finite, the cut's shape), so a tail that gives
                # no finite answer for it (3e38, an int8 scale of 1e38) is the input's range.
                logger.info("tail refused a tensor: %s", exc)
                service.rejected["input_out_of_range"] += 1
                return _error(422, "input_out_of_range", "the tail gives no finite answer for this tensor; send "
                                                         "the head's output for an input in the model's range")
            except Exception:  # one bad request must not take the peer down
                error_id = secrets.token_hex(6)
                logger.exception("internal error %s", error_id)
                service.rejected["internal_error"] += 1
                return _error(500, "internal_error", f"internal error (id {error_id}; the peer's log has it)")

        return wrapped

    @guarded
    async def segment(request: Request) -> Response:
        received_s = time.monotonic()
        chain, index = service.chain(request.query_params.get("variant"), request.query_params.get("cut"))
        graphs = request.headers.get(GRAPHS_HEADER)
        if graphs is not None and not hmac.compare_digest(graphs.encode(), chain.graphs_sha256.encode()):
            raise _Rejected(409, "different_graphs", f"variant {chain.arch_id!r} of this peer's bundle has other "
                                                     "graphs or cuts than the device's: serve the peer half "
                                                     "split from the device's bundle")
        asked = _float_header(request, DEADLINE_HEADER)
        deadline_ms = opts.deadline_ms if asked is None else min(opts.deadline_ms, asked)
        confidence = _float_header(request, CONFIDENCE_HEADER)
        if confidence is not None and confidence > 1:
            raise _Rejected(400, "bad_header", f"{CONFIDENCE_HEADER} must be in (0, 1], got {confidence}")
        body = await _read_body(request, service.body_limit)
        t = decode(body, request.headers, chain.cut(index).tensor.shape)
        return JSONResponse(await service.submit(chain, index, t, confidence, received_s, deadline_ms))

    @guarded
    async def probe(request: Request) -> Response:
        start = time.monotonic()
        body = await _read_body(request, PROBE_MAX_BYTES)
        return JSONResponse({"bytes": len(body), "server_ms": (time.monotonic() - start) * 1e3})

    @guarded
    async def status(request: Request) -> Response:
        return JSONResponse(json.loads(json.dumps(service.status())))

    async def live(request: Request) -> Response:
        return JSONResponse({"status": "live", "role": "peer"})

    async def ready(request: Request) -> Response:
        return JSONResponse({"status": "ready", "role": "peer", "variants": sorted(service.chains)})

    async def http_error(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        return _error(code, {404: "not_found", 405: "method_not_allowed"}.get(code, "http_error"),
                      f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        yield
        await asyncio.get_running_loop().run_in_executor(None, service.shutdown)

    app = Starlette(routes=[
        Route("/v1/segment", segment, methods=["POST"]),
        Route("/v1/probe", probe, methods=["POST"]),
        Route("/v1/status", status, methods=["GET"]),
        Route("/v1/health/live", live, methods=["GET"]),
        Route("/v1/health/ready", ready, methods=["GET"]),
    ], exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    guard = _TokenGuard(app, opts.token)
    guard.connection_stats = service.connection_stats  # ApiServer shares it with the connection layer
    return guard
