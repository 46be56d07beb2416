"""The device's HTTP client to its peer: stdlib ``http.client``, keep-alive, a hard time limit.

Every call takes the time it may spend (``limit_ms``, the request's share of its deadline)
and never blocks longer: the socket timeout is set to what is left before the send
(``sendall`` honours it as a total since Python 3.5), and the answer is read through a
reader that sets it to what is left before every receive, so a peer that trickles its
answer a byte at a time cannot hold the request past its limit either. A timed-out or
broken connection is closed, never reused. Any failure is a :class:`PeerFailure` with a
short reason; the caller finishes the request locally.

:func:`check_answer` and :func:`peer_times_ms` read a segment's answer: a class outside the
bundle's, an exit the variant does not have, a confidence or a time that is not a finite
number in range is a ``bad_reply`` (the request finishes locally), never an answer or a
sample of the link.
"""

from __future__ import annotations

import base64
import functools
import http.client
import io
import json
import math
import queue
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from hmt.errors import UsageError
from hmt.offload.peer import CONFIDENCE_HEADER, DEADLINE_HEADER, GRAPHS_HEADER
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


class _DeadlineReader(io.RawIOBase):
    """A socket's receiving side that raises :class:`TimeoutError` once ``deadline`` (perf_counter
    seconds) has passed, however the bytes arrive: the socket timeout is per receive."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left_s = self._deadline - time.perf_counter()
        if left_s <= 0:
            raise TimeoutError("the peer's answer did not arrive in time")
        self._sock.settimeout(left_s)
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What :class:`http.client.HTTPResponse` reads from: ``makefile`` over a :class:`_DeadlineReader`."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock: socket.socket, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(_DeadlineSocket(sock, deadline), *args, **kwargs)  # type: ignore[arg-type]


def check_answer(body: dict[str, Any], classes: int, exits: int) -> tuple[int, float, int, np.ndarray | None]:
    """(class, confidence, exit, probabilities or None) of a segment's answer; :class:`PeerFailure`
    ``bad_reply`` unless the class is one of ``classes``, the exit one of ``exits``, the confidence a
    number in [0, 1] and the probabilities, when sent, ``classes`` of them in [0, 1]."""
    try:
        values = body["class"], body["confidence"], body["exit"]
    except KeyError as exc:
        raise PeerFailure("bad_reply", f"answer has no {exc}") from exc
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise PeerFailure("bad_reply", "class, confidence and exit must be numbers")
    class_index, confidence, exit_index = values
    if class_index != int(class_index) or not 0 <= class_index < classes:
        raise PeerFailure("bad_reply", f"class {class_index!r} is not one of the bundle's {classes}")
    if exit_index != int(exit_index) or not 0 <= exit_index < exits:
        raise PeerFailure("bad_reply", f"exit {exit_index!r} is not one of the variant's {exits}")
    if not (math.isfinite(confidence) and 0.0 <= confidence <= 1.0):
        raise PeerFailure("bad_reply", f"confidence {confidence!r} is not in [0, 1]")
    return int(class_index), float(confidence), int(exit_index), _probabilities(body.get("probabilities"), classes)


def _probabilities(text: Any, classes: int) -> np.ndarray | None:
    if text is None:
        return None
    try:
        raw = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
    except ValueError as exc:
        raise PeerFailure("bad_reply", "probabilities are not base64") from exc
    if len(raw) != 4 * classes:
        raise PeerFailure("bad_reply", f"{len(raw)} bytes of probabilities, expected {4 * classes}")
    probabilities = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not (np.all(np.isfinite(probabilities)) and np.all((probabilities >= 0) & (probabilities <= 1))):
        raise PeerFailure("bad_reply", "probabilities must be numbers in [0, 1]")
    return probabilities


def peer_times_ms(body: dict[str, Any], elapsed_ms: float) -> tuple[float, float, float]:
    """(server, compute, queue) ms the peer reports; each a finite number from 0 to the round trip
    ``elapsed_ms`` (it cannot have spent longer; 1 ms spared for the clocks), else
    :class:`PeerFailure` ``bad_reply``."""
    times = []
    for key in ("server_ms", "compute_ms", "queue_ms"):
        value = body.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not (math.isfinite(value) and 0.0 <= value <= elapsed_ms + 1.0):
            raise PeerFailure("bad_reply", f"{key} {value!r} is not a time within the round trip")
        times.append(float(value))
    server_ms, compute_ms, queue_ms = times
    if "server_ms" not in body:
        server_ms = compute_ms + queue_ms
    return server_ms, compute_ms, queue_ms


def read_status(body: dict[str, Any], graphs: dict[str, str]) -> tuple[dict[str, list[float]], float | None]:
    """(tail ms per cut of each variant in ``graphs``, the peer's compute ratio or None) from its
    ``GET /v1/status``. :class:`PeerFailure` ``wrong_bundle`` when the peer reports other graphs for
    one of them (``graphs``: the device's digests), ``bad_reply`` when the document is malformed."""
    variants, load = body.get("variants", {}), body.get("load", {})
    if not isinstance(variants, dict) or not isinstance(load, dict):
        raise PeerFailure("bad_reply", "status: 'variants' and 'load' must be objects")
    tails: dict[str, list[float]] = {}
    for arch_id, entry in variants.items():
        if arch_id not in graphs:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("tail_ms", []), list):
            raise PeerFailure("bad_reply", f"status: variant {arch_id!r} is malformed")
        reported = entry.get("graphs_sha256")
        if reported is not None and reported != graphs[arch_id]:
            raise PeerFailure("wrong_bundle", f"the peer runs other graphs or cuts for {arch_id!r} (not the "
                                              "peer half split from this device's bundle)")
        times = entry.get("tail_ms", [])
        if any(isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= 0)
               for t in times):
            raise PeerFailure("bad_reply", f"status: tail_ms of {arch_id!r} must be finite times")
        tails[arch_id] = [float(t) for t in times]
    ratio = load.get("compute_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (math.isfinite(ratio) and ratio > 0):
        return tails, None
    return tails, float(ratio)


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
            conn.response_class = functools.partial(_DeadlineResponse, deadline=deadline)  # type: ignore[assignment]
            response = conn.getresponse()
            data = response.read(_MAX_REPLY_BYTES + 1)
        except (TimeoutError, socket.timeout) as exc:  # socket.timeout is no TimeoutError before 3.10
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
                confidence: float | None, limit_ms: float, graphs_sha256: str | None = None) -> Reply:
        headers = dict(codec_headers)
        headers[DEADLINE_HEADER] = f"{max(1.0, limit_ms):.1f}"
        if graphs_sha256 is not None:
            headers[GRAPHS_HEADER] = graphs_sha256
        if confidence is not None:
            headers[CONFIDENCE_HEADER] = repr(confidence)
        from urllib.parse import quote

        return self.call("POST", f"/v1/segment?variant={quote(arch_id)}&cut={cut}", body=body, headers=headers,
                         limit_ms=limit_ms)

    def status(self, limit_ms: float) -> Reply:
        return self.call("GET", "/v1/status", limit_ms=limit_ms)

    def probe(self, size_bytes: int, limit_ms: float) -> Reply:
        return self.call("POST", "/v1/probe", body=b"\0" * size_bytes, limit_ms=limit_ms)
