"""A small Python client for ``hmt serve``: one keep-alive connection, stdlib HTTP, no torch.

    from hmt.client import HmtClient

    with HmtClient("http://127.0.0.1:8000") as client:          # token=... off loopback
        client.health()                                         # {"live": True, "ready": True, ...}
        answer = client.predict(open("cat.jpg", "rb").read())  # JPEG/PNG bytes
        answer = client.predict(pixels_uint8_hwc)               # or a numpy array: float tensor,
        answer["class_name"], answer["confidence"]              # uint8 pixels, or a batch [N, ...]
        client.predict("cat.jpg", top_k=3)["top_k"]             # a path, or a PIL image; the 3 likeliest
        client.status()["variant"]

A float64 array (numpy's default) is sent as float32, the dtype bundles take; a PIL image is
sent as PNG and a path as the file's bytes (JPEG, PNG or .npy).

A batch ``[N, ...]`` with N > 1 answers ``{"predictions": [...], "batch": N}``; one input
answers ``{"class", "class_name", "confidence", "exit", "variant", "latency_ms", ...}``.

Each request reports the latency this client saw for its *previous* request in the
``X-HMT-Client-Latency-Ms`` header, so the server's loop can see what callers see (the
server's own span stops at its socket). A refusal raises :class:`ServeError` with the
HTTP status and the server's error code and message. A keep-alive connection the server
has closed meanwhile is reopened once and the request resent (predictions have no side
effects). One client holds one connection: use one client per thread.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hmt.errors import HmtError, UsageError

CLIENT_LATENCY_HEADER = "X-HMT-Client-Latency-Ms"
DEADLINE_HEADER = "X-Deadline-Ms"
_MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"\x93NUMPY", "application/x-npy"))
MAX_FILE_BYTES = 64 << 20  # a path's file is read whole: bounded
# Raised by http.client when a kept-alive connection turns out to be closed by the server.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.CannotSendRequest)


class ServeError(HmtError):
    """The server refused a request (``status`` 4xx/5xx) or could not be reached (``status`` None)."""

    exit_code = 7

    def __init__(self, status: int | None, code: str, message: str) -> None:
        super().__init__(f"{status or 'no answer'} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class HmtClient:
    """Keep-alive client of one ``hmt serve`` (see the module docstring)."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = 30.0,
                 report_latency: bool = True) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise UsageError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self.report_latency = report_latency
        self.last_latency_ms: float | None = None  # what this client saw for its last answered request
        self._conn: http.client.HTTPConnection | None = None
        self._used = False  # the open connection has carried a request (so it may have gone stale)

    # -- the API -------------------------------------------------------------------------------

    def predict(self, x: Any, *, deadline_ms: float | None = None, top_k: int | None = None,
                probabilities: bool = False) -> dict[str, Any]:
        """Classify ``x``: a numpy array (float tensor, uint8 pixels [H, W, C], or a batch [N, ...]),
        the bytes of a JPEG, PNG or .npy file, a path to one, or a PIL image. ``top_k``: also the
        k likeliest classes; ``probabilities``: every class's probability."""
        body, media = _encode(x)
        query = []
        if top_k is not None:
            if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
                raise UsageError(f"top_k must be an integer >= 1, got {top_k!r}")
            query.append(f"top_k={top_k}")
        if probabilities:
            query.append("probabilities=true")
        path = "/v1/predict" + ("?" + "&".join(query) if query else "")
        headers = {"Content-Type": media}
        if deadline_ms is not None:
            headers[DEADLINE_HEADER] = f"{deadline_ms:g}"
        if self.report_latency and self.last_latency_ms is not None:
            headers[CLIENT_LATENCY_HEADER] = f"{self.last_latency_ms:.3f}"
        t0 = time.perf_counter()
        doc = self._request("POST", path, body, headers)
        self.last_latency_ms = (time.perf_counter() - t0) * 1e3
        return doc

    def health(self) -> dict[str, Any]:
        """``{"live": bool, "ready": bool, "variant": ...}``; not ready is an answer, not an error."""
        live = self._request("GET", "/v1/health/live")
        try:
            ready = self._request("GET", "/v1/health/ready")
        except ServeError as exc:
            if exc.status != 503:
                raise
            return {"live": live.get("status") == "live", "ready": False, "reason": exc.code}
        return {"live": live.get("status") == "live", "ready": True, "variant": ready.get("variant")}

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: the active variant, load, budgets, queue, connections, recent decisions."""
        return self._request("GET", "/v1/status")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> HmtClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ----------------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout_s)
            self._used = False
        return self._conn

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
        headers = dict(headers or {})
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (0, 1):
            conn = self._connection()
            reused = self._used
            try:
                conn.request(method, self._prefix + path, body=body, headers=headers)
                self._used = True
                response = conn.getresponse()
                data = response.read()
            except _STALE as exc:
                self.close()
                if reused and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: reopen once
                raise ServeError(None, "connection_failed", f"{self.url}: {exc or type(exc).__name__}") from exc
            except OSError as exc:
                self.close()
                raise ServeError(None, "connection_failed", f"{self.url}: {exc}") from exc
            if response.getheader("connection", "").lower() == "close":
                self.close()
            return _answer(response.status, data)
        raise AssertionError("unreachable")


def _answer(status: int, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data) if data else {}
    except ValueError:
        doc = None
    if 200 <= status < 300 and isinstance(doc, dict):
        return doc
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        raise ServeError(status, str(error.get("code", "error")), str(error.get("message", "")))
    raise ServeError(status, "bad_response", data[:200].decode("utf-8", "replace"))


def _encode(x: Any) -> tuple[bytes, str]:
    """A request body and its media type for an array, encoded bytes, a path or a PIL image."""
    if isinstance(x, (str, os.PathLike)):
        path = Path(x)
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise UsageError(f"{path}: {size} bytes is more than the {MAX_FILE_BYTES} a request may carry")
            x = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    elif _is_pil_image(x):
        buffer = io.BytesIO()
        image = x if x.mode in ("RGB", "L") else x.convert("RGB")
        image.save(buffer, format="PNG")
        return buffer.getvalue(), "image/png"
    if isinstance(x, (bytes, bytearray, memoryview)):
        data = bytes(x)
        for magic, media in _MAGIC:
            if data.startswith(magic):
                return data, media
        raise UsageError("predict() takes a numpy array or the bytes of a JPEG, PNG or .npy file; "
                         "these bytes are none of them")
    import numpy as np

    if not isinstance(x, np.ndarray):
        raise UsageError(f"predict() takes a numpy array, bytes, a path or a PIL image, got {type(x).__name__}")
    if x.dtype == np.float64:
        x = x.astype(np.float32)  # numpy's default float; bundles take float32 (the server refuses float64)
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(x), allow_pickle=False)
    return buffer.getvalue(), "application/x-npy"


def _is_pil_image(x: Any) -> bool:
    """Whether ``x`` is a PIL image, without importing Pillow when the caller never did."""
    import sys

    module = sys.modules.get("PIL.Image")
    return module is not None and isinstance(x, module.Image)
