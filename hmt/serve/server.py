"""Run the API under uvicorn: loopback by default, a bearer token for anything else, a drain on SIGTERM.

On SIGTERM (or SIGINT) uvicorn stops accepting connections, waits for the requests in
flight (each awaits its inference), then runs the app's lifespan shutdown, which
finishes every admitted request in the thread pool and stops the control loop. uvicorn
then re-raises the signal it caught; :func:`serve_forever` installs a Python handler for
SIGTERM first so that re-raise returns instead of killing the process, and the
process exits 0 after a complete drain.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any

from hmt.errors import DeviceError, UsageError

TOKEN_ENV = "HMT_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("localhost",)


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
    if chosen is not None and len(chosen) < MIN_TOKEN_CHARS:
        raise UsageError(f"--token / {TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters, got {len(chosen)}")
    if chosen is None and not is_loopback(host):
        raise UsageError(f"--host {host} is not a loopback address: pass --token or set {TOKEN_ENV} "
                         "(every request must then carry 'Authorization: Bearer <token>')")
    return chosen


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DeviceError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    graceful_timeout_s: float = 30.0
    access_log: bool = False
    log_level: str = "warning"


class ApiServer:
    """uvicorn around an ASGI app, on a socket bound up front (so the port is known and errors are clear)."""

    def __init__(self, app: Any, options: ServerOptions) -> None:
        import uvicorn

        self.options = options
        self.socket = bind_socket(options.host, options.port)
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(app, log_level=options.log_level, access_log=options.access_log, lifespan="on",
                                timeout_graceful_shutdown=int(max(1, options.graceful_timeout_s)))
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = self.options.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve on the calling (main) thread until SIGTERM/SIGINT, then drain and return."""
        previous = signal.getsignal(signal.SIGTERM)
        if previous in (signal.SIG_DFL, None):
            # uvicorn re-raises the signal it handled after the drain; a Python handler makes that a no-op.
            signal.signal(signal.SIGTERM, lambda signum, frame: None)
        logging.getLogger("uvicorn.error").setLevel(self.options.log_level.upper())
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()
            if previous in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def start_background(self, timeout_s: float = 30.0) -> None:
        """Serve on a daemon thread (no signal handling there); returns once it accepts connections."""
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                        name="hmt-serve-api", daemon=True)
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
