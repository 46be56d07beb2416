"""Run the API under uvicorn: loopback by default, a bearer token for anything else, a drain on SIGTERM.

Connections are guarded below the app (:mod:`hmt.serve.http.connections`): a cap at accept
time, a receipt deadline for headers and body, TCP_NODELAY, a bounded shutdown. At start
the soft file-descriptor limit is raised to the hard one, and the cap is kept below it.

On SIGTERM (or SIGINT) uvicorn stops accepting connections, waits for the requests in
flight (each awaits its inference), then runs the app's lifespan shutdown, which
finishes every admitted request in the thread pool and stops the control loop. uvicorn
then re-raises the signal it caught; :func:`serve_forever` installs a Python handler for
SIGTERM first so that re-raise returns instead of killing the process, and the
process exits 0 after a complete drain.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

from hmt.errors import DeviceError, UsageError
from hmt.serve.http.connections import (
    AcceptErrorLog,
    ConnectionGuard,
    ConnectionStats,
    GuardedListener,
    guarded_protocol,
)
from hmt.serve.http.lograte import RepeatFilter, install
from hmt.serve.http.logs import LOG_FORMATS, logging_config

TOKEN_ENV = "HMT_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("localhost",)
# File descriptors kept free of connections: graph files, /proc reads, logs, the listening socket.
FD_RESERVE = 64


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_token(host: str, token: str | None) -> str | None:
    """The token to require: ``token`` or ``$HMT_SERVE_TOKEN``; refuses a non-loopback host without one."""
    chosen = token if token else os.environ.get(TOKEN_ENV) or None
    if chosen is not None and not all("!" <= ch <= "~" for ch in chosen):
        # A header value cannot carry such a token intact (clients and proxies trim or mangle
        # whitespace), so it would refuse every request; refuse it here instead.
        raise UsageError(f"--token / {TOKEN_ENV} must be printable ASCII without spaces (e.g. openssl rand -hex 24)")
    if chosen is not None and len(chosen) < MIN_TOKEN_CHARS:
        raise UsageError(f"--token / {TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters, got {len(chosen)}")
    if chosen is None and not is_loopback(host):
        raise UsageError(f"--host {host} is not a loopback address: pass --token or set {TOKEN_ENV} "
                         "(every request must then carry 'Authorization: Bearer <token>')")
    return chosen


def bind_socket(host: str, port: int, factory: type[socket.socket] = socket.socket) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port), an instance of ``factory``."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says it is TCP (accepted sockets inherit its proto). With proto 0
    # every keep-alive response waited ~40 ms for the client's delayed ACK (Nagle).
    sock = factory(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DeviceError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed; (soft before, soft now).
    Where the platform has no such limit: (-1, -1)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft


def fd_budget(fd_soft_limit: int) -> int:
    """Descriptors connections may use: the soft limit less the reserve (-1: unbounded)."""
    return -1 if fd_soft_limit < 0 else max(1, fd_soft_limit - FD_RESERVE)


def connection_cap(requested: int, fd_soft_limit: int) -> int:
    """At most ``requested`` connections, and a quarter of the descriptor budget (at least 64)
    left over for connections accepted in a burst before the cap has closed others."""
    budget = fd_budget(fd_soft_limit)
    if budget < 0:
        return requested
    return max(1, min(requested, budget - max(64, budget // 4)))


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    # Requests already received drain for at most this long on SIGTERM (requests still
    # being received are cut at once).
    graceful_timeout_s: float = 30.0
    access_log: bool = False
    log_level: str = "warning"
    # "text" or "json" (hmt.serve.http.logs); None: uvicorn's own logging setup, the hmt loggers untouched
    # (a library user's, or a test's, logging stays theirs). The command line always sets one.
    log_format: str | None = None
    max_connections: int = 512
    # From accept (or a keep-alive request's first byte) to the body's last byte.
    receipt_timeout_s: float = 10.0
    keep_alive_s: int = 5
    raise_fd_limit: bool = True

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise UsageError(f"--max-connections must be >= 1, got {self.max_connections}")
        if not (math.isfinite(self.receipt_timeout_s) and self.receipt_timeout_s > 0):
            raise UsageError(f"--receipt-timeout-s must be a finite number > 0, got {self.receipt_timeout_s}")
        if self.keep_alive_s < 1:
            raise UsageError(f"keep_alive_s must be >= 1, got {self.keep_alive_s}")
        if self.log_format is not None and self.log_format not in LOG_FORMATS:
            raise UsageError(f"--log-format must be one of {list(LOG_FORMATS)}, got {self.log_format!r}")


class ApiServer:
    """uvicorn around an ASGI app, on a socket bound up front (so the port is known and errors are clear).

    ``uvicorn_options``: more ``uvicorn.Config`` keywords (the offload peer's TLS files)."""

    def __init__(self, app: Any, options: ServerOptions, uvicorn_options: dict[str, Any] | None = None) -> None:
        import uvicorn

        self.options = options
        if options.raise_fd_limit:
            self.fd_limit = raise_fd_limit()  # (soft before, soft now)
        else:
            soft = _fd_soft_limit()
            self.fd_limit = (soft, soft)
        # The app may share its stats object (create_app does) so /v1/status can show them.
        stats = getattr(app, "connection_stats", None)
        self.stats: ConnectionStats = stats if isinstance(stats, ConnectionStats) else ConnectionStats()
        self.guard = ConnectionGuard(connection_cap(options.max_connections, self.fd_limit[1]),
                                     options.receipt_timeout_s, self.stats, fd_budget=fd_budget(self.fd_limit[1]))
        listener = bind_socket(options.host, options.port, factory=GuardedListener)
        assert isinstance(listener, GuardedListener)
        listener.guard = self.guard
        self.socket: socket.socket = listener
        self.port = int(self.socket.getsockname()[1])
        extra: dict[str, Any] = {"log_level": options.log_level}
        if options.log_format is not None:
            # Our dictConfig sets every level (uvicorn's log_level would put the access log at warning).
            extra = {"log_config": logging_config(options.log_level, options.log_format, options.access_log),
                     "log_level": None}
        config = uvicorn.Config(app, access_log=options.access_log, lifespan="on",
                                http=guarded_protocol(self.guard), timeout_keep_alive=options.keep_alive_s,
                                timeout_graceful_shutdown=int(max(1, options.graceful_timeout_s)), **extra,
                                **(uvicorn_options or {}))
        self.server = uvicorn.Server(config)
        # A flood of hostile connections repeats the same warnings: a few per 10 s each, then counted.
        self.log_filter = RepeatFilter()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = self.options.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve on the calling (main) thread until SIGTERM/SIGINT, then drain and return."""
        previous = signal.getsignal(signal.SIGTERM)
        # uvicorn re-raises the signal it handled after the drain; a no-op handler makes that return (the
        # hmt command line's handler, which unwinds other commands on SIGTERM, would end a drained serve
        # as 'terminated'). The caller's handler is put back after.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        logging.getLogger("uvicorn.error").setLevel(self.options.log_level.upper())
        try:
            self._serve_blocking()
        finally:
            self.socket.close()
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

    async def _serve(self) -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptErrorLog(self.stats))
        remove = install(self.log_filter)
        try:
            await self.server.serve(sockets=[self.socket])
        finally:
            remove()

    def _serve_blocking(self) -> None:
        """``uvicorn.Server.run`` with our loop exception handler installed first."""
        config = self.server.config
        factory = config.get_loop_factory() if hasattr(config, "get_loop_factory") else None
        if factory is not None and sys.version_info >= (3, 11):
            with asyncio.Runner(loop_factory=factory) as runner:  # novermin (3.11+ only, guarded above)
                runner.run(self._serve())
        else:
            asyncio.run(self._serve())

    def start_background(self, timeout_s: float = 30.0) -> None:
        """Serve on a daemon thread (no signal handling there); returns once it accepts connections."""
        self._thread = threading.Thread(target=self._serve_blocking, name="hmt-serve-api", daemon=True)
        self._thread.start()
        waited = threading.Event()
        for _ in range(int(timeout_s / 0.02)):
            if self.server.started:
                return
            if not self._thread.is_alive():
                break
            waited.wait(0.02)
        raise DeviceError(f"the API server did not start on {self.url}")

    def stop_background(self, timeout_s: float = 60.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.socket.close()


def _fd_soft_limit() -> int:
    try:
        import resource
    except ImportError:
        return -1
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return -1 if soft == resource.RLIM_INFINITY else int(soft)
