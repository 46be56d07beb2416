"""The device's HTTP client to its peer: stdlib ``http.client``, keep-alive, a hard time limit.

Every call takes the time it may spend (``limit_ms``, the request's share of its deadline)
and never blocks longer: the socket timeout is set to what is left before the send and
again before the answer is read (``sendall`` honours it as a total since Python 3.5). A
timed-out or broken connection is closed, never reused. Any failure is a
:class:`PeerFailure` with a short reason; the caller finishes the request locally.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hmt.errors import UsageError
from hmt.offload.peer import CONFIDENCE_HEADER, DEADLINE_HEADER
from hmt.offload.timing import NO_SHARE, DeviceShare, thread_times_ms

_MAX_REPLY_BYTES = 1 << 16
_POOL = 8


class PeerFailure(Exception):
    """The peer did not answer usefully in time: ``reason`` says why (refused, timeout, http_503, ...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Reply:
    body: dict[str, Any]
    elapsed_ms: float
    # The calling thread's own part of ``elapsed_ms`` (its CPU, and its wait for the core where
    # the system counts it): device time, not link time (:mod:`hmt.offload.timing`).
    device: DeviceShare = NO_SHARE


class PeerClient:
    def __init__(self, url: str, *, token: str | None = None, cafile: Path | None = None,
                 insecure_tls: bool = False) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--peer {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        self.token = token
        self._context: ssl.SSLContext | None = None
        if self.https:
            self._context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
            if insecure_tls:
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE
        self._idle: queue.LifoQueue[http.client.HTTPConnection] = queue.LifoQueue(_POOL)

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            if self.https:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout_s, context=self._context)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        return conn

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        try:
            self._idle.put_nowait(conn)
        except queue.Full:
            conn.close()

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def call(self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
             limit_ms: float) -> Reply:
        """One request; :class:`PeerFailure` unless a 2xx JSON answer arrives within ``limit_ms``."""
        start = time.perf_counter()
        before = thread_times_ms()
        deadline = start + max(0.0, limit_ms) / 1e3
        if limit_ms <= 0:
            raise PeerFailure("no_time", "no share of the deadline left for the peer")
        sent = dict(headers or {})
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            sent.setdefault("Content-Type", "application/octet-stream")
        conn = self._connection(limit_ms / 1e3)
        try:
            if conn.sock is None:
                conn.timeout = max(1e-3, deadline - time.perf_counter())
                conn.connect()
                # Without it, Nagle holds the second segment of a request until the peer's delayed
                # ACK (~40 ms on Linux): every round trip would cost 40 ms more than the link does.
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]
            conn.sock.settimeout(max(1e-3, deadline - time.perf_counter()))
            conn.request(method, path, body=body, headers=sent)
            conn.sock.settimeout(max(1e-3, deadline - time.perf_counter()))
            response = conn.getresponse()
            data = response.read(_MAX_REPLY_BYTES + 1)
        except TimeoutError as exc:
            conn.close()
            raise PeerFailure("timeout", f"no answer within {limit_ms:.1f} ms") from exc
        except ConnectionRefusedError as exc:
            conn.close()
            raise PeerFailure("refused", str(exc)) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise PeerFailure("broken", f"{type(exc).__name__}: {exc}") from exc
        elapsed_ms = (time.perf_counter() - start) * 1e3
        device = DeviceShare.between(before, thread_times_ms())
        if response.will_close:
            conn.close()
        else:
            self._give_back(conn)
        if not 200 <= response.status < 300:
            raise PeerFailure(f"http_{response.status}", data[:200].decode(errors="replace"))
        if len(data) > _MAX_REPLY_BYTES:
            raise PeerFailure("bad_reply", "answer larger than expected")
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise PeerFailure("bad_reply", "answer is not JSON") from exc
        if not isinstance(doc, dict):
            raise PeerFailure("bad_reply", "answer is not a JSON object")
        return Reply(doc, elapsed_ms, device)

    def segment(self, arch_id: str, cut: int, body: bytes, codec_headers: dict[str, str], *,
                confidence: float | None, limit_ms: float) -> Reply:
        headers = dict(codec_headers)
        headers[DEADLINE_HEADER] = f"{max(1.0, limit_ms):.1f}"
        if confidence is not None:
            headers[CONFIDENCE_HEADER] = repr(confidence)
        from urllib.parse import quote

        return self.call("POST", f"/v1/segment?variant={quote(arch_id)}&cut={cut}", body=body, headers=headers,
                         limit_ms=limit_ms)

    def status(self, limit_ms: float) -> Reply:
        return self.call("GET", "/v1/status", limit_ms=limit_ms)

    def probe(self, size_bytes: int, limit_ms: float) -> Reply:
        return self.call("POST", "/v1/probe", body=b"\0" * size_bytes, limit_ms=limit_ms)
