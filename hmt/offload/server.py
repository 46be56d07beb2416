"""Run the peer under uvicorn: loopback by default, a token off loopback, TLS when given a certificate,
the main server's connection guards."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hmt.bundle import load_checked_bundle
from hmt.errors import InputError, UsageError
from hmt.offload.peer import PeerOptions, PeerService, create_peer_app
from hmt.offload.plan import load_plan
from hmt.serve.http.server import ApiServer, ServerOptions


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
              engine: str = "auto", *, trusted_key: Path | str | None = None, rollback: Any | None = None
              ) -> PeerService:
    """Load and verify the peer bundle (and its offload plan) with the checks ``hmt serve`` runs on any
    bundle (:func:`hmt.bundle.load_checked_bundle`: unlisted files, symlinks, serve.json, target, ELF
    machines; with ``trusted_key`` its signature and, with ``rollback``, its release), then build and warm
    every variant's chain with the runtime layer's engine for it (``auto``: fuse's choice where it runs here)."""
    bundle = load_checked_bundle(bundle_path, trusted_key=trusted_key, rollback=rollback)
    return PeerService(bundle, load_plan(bundle), options, threads=threads, engine=engine)


def serve_peer(service: PeerService, host: str, port: int, *, tls: TlsOptions | None = None,
               log_level: str = "warning", on_listening: Callable[[str], None] | None = None,
               max_connections: int = 512, receipt_timeout_s: float = 10.0) -> None:
    """Serve the peer on the calling thread until SIGTERM/SIGINT; in-flight segments finish first.

    The main server's connection layer (:class:`hmt.serve.http.server.ApiServer`): a connection cap
    and a descriptor budget at accept, a receipt deadline, TCP_NODELAY, a bounded shutdown, and
    repeated log lines rate-limited."""
    if tls is None and service.options.token is not None and host not in ("127.0.0.1", "::1", "localhost"):
        logging.getLogger(__name__).warning("peer on %s without TLS: the token travels in clear text", host)
    tls_options: dict[str, Any] = {}
    if tls is not None:
        tls_options = {"ssl_certfile": str(tls.certfile), "ssl_keyfile": str(tls.keyfile),
                       "ssl_keyfile_password": tls.password}
    options = ServerOptions(host=host, port=port, graceful_timeout_s=10.0, log_level=log_level,
                            max_connections=max_connections, receipt_timeout_s=receipt_timeout_s)
    server = ApiServer(create_peer_app(service), options, uvicorn_options=tls_options)
    scheme = "https" if tls is not None else "http"
    url = f"{scheme}://[{host}]:{server.port}" if ":" in host else f"{scheme}://{host}:{server.port}"
    if on_listening is not None:
        on_listening(url)
    server.run()


def check_role(role: str) -> str:
    if role not in ("device", "peer"):
        raise UsageError(f"--role must be device or peer, got {role!r}")
    return role
