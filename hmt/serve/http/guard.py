"""The API's outermost layer (pure ASGI): the bearer token, response counts by route and status,
and each answered prediction's whole server-side span; plus the JSON error answers of ``/v1``.

``/v2`` requests (the Open Inference Protocol, :mod:`hmt.serve.http.oip`) are counted under their
route template and refused in that protocol's error shape.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Hashable, MutableMapping, Optional

from starlette.responses import JSONResponse

from hmt.serve.http.connections import FIRST_BYTE_KEY, ConnectionStats
from hmt.serve.http.oip import INFER_LABEL as V2_INFER_LABEL
from hmt.serve.http.oip import PREFIX as V2_PREFIX
from hmt.serve.http.oip import error_response as v2_error_response
from hmt.serve.http.oip import route_label

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# (route label, span in ms, the client's reported latency in ms or None, the connection or None)
SpanHandler = Callable[[str, float, Optional[float], Optional[Hashable]], None]

KNOWN_PATHS = ("/v1/predict", "/v1/health/live", "/v1/health/ready", "/v1/status", "/metrics", "/openapi.json")
SPAN_LABELS = ("/v1/predict", V2_INFER_LABEL)
CLIENT_MS_KEY = "hmt.client_latency_ms"  # scope extension: the X-HMT-Client-Latency-Ms value

logger = logging.getLogger("hmt.serve.http.api")


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def incident_message(exc: BaseException) -> str:
    """What a 500 tells the client (nothing internal); the log has the traceback under the same id."""
    incident = secrets.token_hex(4)
    logger.error("internal error %s", incident, exc_info=exc)
    return f"internal error (id {incident}); the server log has the details"


def internal_error(exc: BaseException) -> JSONResponse:
    return error_response(500, "internal_error", incident_message(exc))


def connection_key(scope: Scope) -> Hashable | None:
    client = scope.get("client")
    return tuple(client) if isinstance(client, (list, tuple)) else None


class Guard:
    """Pure ASGI middleware: the bearer token, response counts by path and status, and each
    prediction's whole span (first byte in to last byte out)."""

    def __init__(self, app: ASGIApp, token: str | None, counts: Counter[tuple[str, int]], *,
                 open_prefixes: tuple[str, ...], on_span: SpanHandler) -> None:
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
        label = route_label(path) if v2 else path if path in KNOWN_PATHS else "other"
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
                    and label in SPAN_LABELS and status[0] == 200):
                # The last byte is handed to the transport: the request's whole server-side span.
                self.on_span(label, (time.monotonic() - first_byte_s) * 1e3, extensions.get(CLIENT_MS_KEY),
                             connection_key(scope))

        await self.app(scope, receive, counting_send)
