"""Run the peer under uvicorn: loopback by default, a token off loopback, TLS when given a certificate."""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hmt.bundle import load_bundle
from hmt.errors import InputError, UsageError
from hmt.offload.peer import PeerOptions, PeerService, create_peer_app
from hmt.offload.plan import load_plan
from hmt.serve.http.server import bind_socket


@dataclass(frozen=True)
class TlsOptions:
    """uvicorn's ssl options: a PEM certificate chain and its key (and an optional key password)."""

    certfile: Path
    keyfile: Path
    password: str | None = None

    def __post_init__(self) -> None:
        for name, path in (("--ssl-certfile", self.certfile), ("--ssl-keyfile", self.keyfile)):
            if not Path(path).is_file():
                raise InputError(f"{name} {path}: does not exist; expected a PEM file")


def open_peer(bundle_path: Path | str, options: PeerOptions, threads: int | None = 1,
              engine: str = "auto") -> PeerService:
    """Load and verify the peer bundle (and its offload plan), build and warm every variant's chain
    with the runtime layer's engine for it (``auto``: fuse's choice where it runs here)."""
    bundle = load_bundle(bundle_path)
    return PeerService(bundle, load_plan(bundle), options, threads=threads, engine=engine)


def serve_peer(service: PeerService, host: str, port: int, *, tls: TlsOptions | None = None,
               log_level: str = "warning", on_listening: Callable[[str], None] | None = None) -> None:
    """Serve the peer on the calling thread until SIGTERM/SIGINT; in-flight segments finish first."""
    import uvicorn

    if tls is None and service.options.token is not None and host not in ("127.0.0.1", "::1", "localhost"):
        logging.getLogger(__name__).warning("peer on %s without TLS: the token travels in clear text", host)
    sock = bind_socket(host, port)
    # Accepted sockets inherit it: a keep-alive answer written in two parts (headers, body) must
    # not wait for the device's delayed ACK (~40 ms per request otherwise, measured on loopback).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    kwargs: dict[str, Any] = {}
    if tls is not None:
        kwargs = {"ssl_certfile": str(tls.certfile), "ssl_keyfile": str(tls.keyfile),
                  "ssl_keyfile_password": tls.password}
    config = uvicorn.Config(create_peer_app(service), log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=10, **kwargs)
    server = uvicorn.Server(config)
    scheme = "https" if tls is not None else "http"
    bound = int(sock.getsockname()[1])
    url = f"{scheme}://[{host}]:{bound}" if ":" in host else f"{scheme}://{host}:{bound}"
    if on_listening is not None:
        on_listening(url)
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # uvicorn re-raises after its drain
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def check_role(role: str) -> str:
    if role not in ("device", "peer"):
        raise UsageError(f"--role must be device or peer, got {role!r}")
    return role
