"""Connection-level guards under uvicorn's h11 protocol: a cap, a receipt deadline, TCP_NODELAY.

uvicorn bounds neither how many connections are open nor how long a client may take to
deliver a request (its keep-alive timeout starts only after a response). A client that
trickles header bytes (slowloris) therefore holds a file descriptor for as long as it
likes, and ~1,000 of them exhaust the usual 1,024-fd limit before the bearer token is
ever read (it is a header). :func:`guarded_protocol` builds an ``H11Protocol`` subclass
that adds, for one server:

- **a descriptor budget at accept() itself** (:class:`GuardedListener`): while the
  connections accepted and not yet closed use the process's budget of descriptors, the
  listening socket reports "nothing to accept" and new connections wait in the kernel's
  queue. asyncio accepts a whole burst per loop pass before any protocol sees it, so
  without this a reconnect burst ran the process out of descriptors (EMFILE) and asyncio
  stopped accepting for a second.
- **a connection cap** when a connection is set up. At the cap, the connection that has waited
  longest *without a complete request* (still receiving one, or idle between keep-alive
  requests) is closed to make room, the way a server under a slow-client flood sheds its
  slowest clients first; a connection whose request is already received is never
  dropped. When every connection is running a request, the new one gets 503 and closes.
- **a receipt deadline**, from accept (or from the first byte of a later keep-alive
  request) to the last byte of the body, covering headers and body. Past it: 408 (in the Open
  Inference Protocol's error shape for a ``/v2`` request), close. A request the app answered
  before reading its body (401, 413) gets no second response: the connection is closed if the
  rest of the body is late, and idle (keep-alive) once it is in.
- **TCP_NODELAY** on every accepted socket. ``server.bind_socket`` creates the listening
  socket with ``IPPROTO_TCP`` so asyncio sets it too; this is the explicit guarantee
  (without it Nagle holds each small response until the client's delayed ACK, ~40 ms).
- **a bounded shutdown**: a connection still *receiving* a request is cut at once (503)
  instead of being waited for; requests already received drain.
- **the first byte's time** of each request in its ASGI scope
  (``scope["extensions"]["hmt.first_byte_s"]``, ``time.monotonic``), so the API can count
  receipt, parse and queueing time in a request's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

FIRST_BYTE_KEY = "hmt.first_byte_s"
_ACCEPT_ERROR = "socket.accept() out of system resource"
_REASONS = {408: b"Request Timeout", 503: b"Service Unavailable"}
_V2 = b"/v2"  # the Open Inference Protocol's prefix (hmt.serve.http.oip.PREFIX): its errors are {"error": str}

logger = logging.getLogger("hmt.serve.http.connections")


@dataclass
class ConnectionStats:
    """Counters of the connection layer (read by ``/v1/status`` and ``/metrics``)."""

    max_connections: int = 0
    receipt_timeout_s: float = 0.0
    open: int = 0
    accepted: int = 0
    refused_full: int = 0  # at the cap with every connection running a request: 503 at accept
    evicted: int = 0  # closed to make room for a new connection (waited longest without a request)
    receipt_timeouts: int = 0  # request not received within the deadline: 408
    shutdown_cut: int = 0  # still receiving a request at shutdown: 503
    accept_errors: int = 0  # accept() failed for lack of file descriptors (EMFILE/ENFILE)
    accept_deferred: int = 0  # accept() passes that left connections queued: the descriptor budget was spent
    fd_budget: int = -1  # descriptors connections may use (-1: unbounded)

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConnectionGuard:
    """The state shared by every connection of one server."""

    max_connections: int
    receipt_timeout_s: float
    stats: ConnectionStats = field(default_factory=ConnectionStats)
    fd_budget: int = -1  # -1: unbounded
    fds_in_use: int = 0  # accepted and not yet closed (counted at accept, released at connection_lost)
    accepted: weakref.WeakSet[socket.socket] = field(default_factory=weakref.WeakSet)
    # Connections without a complete request, oldest first (insertion order = since when).
    waiting: OrderedDict[GuardedH11Protocol, None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.stats.max_connections = self.max_connections
        self.stats.receipt_timeout_s = self.receipt_timeout_s
        self.stats.fd_budget = self.fd_budget

    def recount(self) -> int:
        """``fds_in_use`` counted from the accepted sockets still open: heals the running count
        if asyncio ever closed an accepted socket without a ``connection_lost`` (a failed setup)."""
        self.fds_in_use = sum(1 for s in list(self.accepted) if s.fileno() != -1)
        return self.fds_in_use

    def make_room(self) -> bool:
        """Close the connection waiting longest without a request; False when there is none."""
        while self.waiting:
            victim, _ = self.waiting.popitem(last=False)
            if victim.transport is None or victim.transport.is_closing():
                continue
            self.stats.evicted += 1
            victim.cut(503, "connection_limit", "the server is at its connection limit and closed this "
                                                "connection, which had not sent a complete request")
            return True
        return False


def error_bytes(status: int, code: str, message: str, v2: bool = False) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection (written outside h11's state machine):
    ``/v1``'s error body, or with ``v2`` the Open Inference Protocol's ``{"error": message}``."""
    body = json.dumps({"error": message} if v2 else {"error": {"code": code, "message": message}}).encode()
    head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS.get(status, b"Error"), len(body)))
    return head + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the guards of the module docstring; ``guard`` is set per server."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._receiving = False  # a request is being received (its deadline runs)
        self._first_byte_s: float | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        guard.stats.accepted += 1
        if guard.stats.open >= guard.max_connections and not guard.make_room():
            self._refused = True
            guard.stats.refused_full += 1
            self.transport = transport
            transport.write(error_bytes(503, "connection_limit", f"the server is at its limit of "
                                        f"{guard.max_connections} connections, all running requests; retry later"))
            transport.close()
            return
        guard.stats.open += 1
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._start_receiving()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.guard.waiting.pop(self, None)
        self.guard.fds_in_use = max(0, self.guard.fds_in_use - 1)
        if self._refused:
            return
        self.guard.stats.open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._first_byte_s is None:
            self._first_byte_s = time.monotonic()
        if not self._receiving:  # the first byte of the next request on a keep-alive connection
            self._start_receiving()
        answered = self._answered_before_body()
        super().data_received(data)
        if answered and self.conn.their_state is h11.IDLE:
            # The rest of a body answered early (401, 413) is in and uvicorn started the next
            # cycle without a keep-alive timer: idle now, as after any response.
            self._idle()
            if self.conn.trailing_data[0]:  # the next request has begun
                self._first_byte_s = time.monotonic()
                self._start_receiving()
            else:
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)
        self._after_events()

    # -- uvicorn hooks -----------------------------------------------------------------------

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined request
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            self._idle()
        else:
            if not self._receiving:
                self._start_receiving()
            self._after_events()

    def shutdown(self) -> None:
        cycle = self.cycle
        if self._receiving and cycle is not None and not cycle.response_started:
            # The body is still coming in: waiting for it is what made shutdown take 30 s.
            self.guard.stats.shutdown_cut += 1
            self.cut(503, "shutting_down", "the server is shutting down")
            return
        super().shutdown()

    # -- the guards ----------------------------------------------------------------------------

    def _idle(self) -> None:
        """Idle between requests: uvicorn's keep-alive timeout applies; evictable meanwhile."""
        self._receiving = False
        self._first_byte_s = None
        self._cancel_timer()
        self.guard.waiting.pop(self, None)
        self.guard.waiting[self] = None

    def _answered_before_body(self) -> bool:
        """The request being received was already answered (the app did not wait for its body)."""
        cycle = self.cycle
        return cycle is not None and cycle.response_complete and self.conn.their_state is h11.SEND_BODY

    def _speaks_v2(self) -> bool:
        """The request being received is for ``/v2`` (from its parsed target, or its first line so far)."""
        if self.conn.their_state is h11.IDLE:
            line = bytes(self.conn.trailing_data[0][:512]).split(b"\r\n", 1)[0].split(b" ")
            target = line[1] if len(line) > 1 else b""
        else:
            target = self.scope.get("path", "").encode() if self.scope is not None else b""
        return target == _V2 or target.startswith((_V2 + b"/", _V2 + b"?"))

    def _start_receiving(self) -> None:
        self._receiving = True
        self._cancel_timer()
        self._timer = self.loop.call_later(self.guard.receipt_timeout_s, self._receipt_expired)
        self.guard.waiting.pop(self, None)
        self.guard.waiting[self] = None

    def _after_events(self) -> None:
        scope = self.scope
        if scope is not None:
            extensions: dict[str, Any] = scope.setdefault("extensions", {})
            if FIRST_BYTE_KEY not in extensions:  # this request's scope was just created
                extensions[FIRST_BYTE_KEY] = self._first_byte_s or time.monotonic()
        if self._receiving and self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._receiving = False  # the whole request is in: from here on it is the server's time
            self._first_byte_s = None
            self._cancel_timer()
            self.guard.waiting.pop(self, None)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _receipt_expired(self) -> None:
        self._timer = None
        if not self._receiving or self.transport.is_closing():
            return
        self.guard.stats.receipt_timeouts += 1
        self.cut(408, "request_timeout", f"the request (headers and body) was not received within "
                                         f"{self.guard.receipt_timeout_s:g} s")

    def cut(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` (unless a response has started) and close the connection now."""
        self._cancel_timer()
        self.guard.waiting.pop(self, None)
        self._receiving = False
        if self.transport is None or self.transport.is_closing():
            return
        cycle = self.cycle
        idle = self.conn.their_state is h11.IDLE and self._first_byte_s is None and (
            cycle is None or cycle.response_complete)
        if not idle and not self._answered_before_body() and (
                cycle is None or not cycle.response_started or cycle.response_complete):
            self.transport.write(error_bytes(status, code, message, self._speaks_v2()))
        if cycle is not None and not cycle.response_complete:
            # The app may be waiting for the rest of the body: it now reads a disconnect, and
            # whatever it answers is dropped (the connection is gone).
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


class GuardedListener(socket.socket):
    """A listening socket whose ``accept()`` leaves connections in the kernel's queue while
    ``guard.fds_in_use`` has reached ``guard.fd_budget`` (asyncio reads the raised
    BlockingIOError as "nothing to accept" and tries again on the next readiness event,
    by which time the connections the cap closed have released their descriptors)."""

    guard: ConnectionGuard | None = None

    def accept(self) -> tuple[socket.socket, Any]:
        guard = self.guard
        if guard is not None and 0 <= guard.fd_budget <= guard.fds_in_use and guard.fd_budget <= guard.recount():
            guard.stats.accept_deferred += 1
            raise BlockingIOError(errno.EAGAIN, "descriptor budget in use; connections stay queued")
        conn, address = super().accept()
        if guard is not None:
            guard.fds_in_use += 1
            guard.accepted.add(conn)
        return conn, address


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` bound to ``guard``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": guard})


class AcceptErrorLog:
    """Event-loop exception handler: accept() running out of file descriptors is logged at most
    once per ``interval_s`` with a count, not once per attempt (asyncio retries in a tight loop
    and logged a traceback each time: 283 MB in a minute). Anything else goes to the default."""

    def __init__(self, stats: ConnectionStats, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, log: logging.Logger = logger) -> None:
        self.stats = stats
        self.interval_s = interval_s
        self.clock = clock
        self.log = log
        self._last_s = -float("inf")
        self._since_last = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith(_ACCEPT_ERROR):
            loop.default_exception_handler(context)
            return
        self.stats.accept_errors += 1
        self._since_last += 1
        now = self.clock()
        if now - self._last_s >= self.interval_s:
            exc = context.get("exception")
            self.log.warning("accept() failed %d time(s) since the last report (%s); open connections %d, "
                             "cap %d: raise the file-descriptor limit or lower --max-connections",
                             self._since_last, exc, self.stats.open, self.stats.max_connections)
            self._last_s = now
            self._since_last = 0
