"""The offloading branches of ``hmt serve``: ``--role peer`` and ``--peer URL`` (wired in commands/serve.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from commands._output import Output


def note_listening(output: Output, bundle: Path, message: str) -> None:
    """``message`` (the address serve listens on), then, for a bundle built for another CPU
    architecture than this machine's, a note saying what of it does not describe this machine.
    Called once listening: the bundle has passed serve's checks by then."""
    import platform

    from hmt.bundle import foreign_machine_note, load_bundle

    output.note(message)
    note = foreign_machine_note(load_bundle(bundle, verify_checksums=False), platform.machine())
    if note is not None:
        output.note(f"note: {note}")


def refuse_other_roles_options(*, peer_role: bool, device_only: dict[str, bool], peer_only: dict[str, bool]) -> None:
    """Options the chosen role would silently ignore are a usage error (exit 2): --role peer runs
    tails for devices (no predictions, budgets or adaptation of its own); only the peer serves TLS
    (a device given --ssl-certfile would serve plain HTTP, its token in the clear)."""
    from hmt.errors import UsageError

    if peer_role:
        given = [flag for flag, on in device_only.items() if on]
        if given:
            raise UsageError(f"{', '.join(given)} configure the device's own serving, which --role peer does not "
                             "do (it runs the tails devices send; budgets, variants and adaptation are the "
                             "device's): drop them, or serve the device half with them and --peer")
        return
    given = [flag for flag, on in peer_only.items() if on]
    if given:
        raise UsageError(f"{' and '.join(given)} go with --role peer: the device API serves plain HTTP "
                         "(put a TLS-terminating proxy in front of it for the network)")


def run_peer(output: Output, bundle: Path, *, host: str, port: int, token: str | None, workers: int,
             max_queue: int, deadline_ms: float,
             threads: int | None, engine: str | None, ssl_certfile: Path | None, ssl_keyfile: Path | None,
             debug: bool, trusted_key: Path | None = None, rollback: Any = None, max_connections: int = 512,
             receipt_timeout_s: float = 10.0) -> None:
    from hmt.errors import UsageError
    from hmt.offload.peer import PeerOptions
    from hmt.offload.server import TlsOptions, open_peer, serve_peer
    from hmt.serve.http.server import resolve_token

    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise UsageError("--ssl-certfile and --ssl-keyfile go together")
    tls = None if ssl_certfile is None or ssl_keyfile is None else TlsOptions(ssl_certfile, ssl_keyfile)
    options = PeerOptions(token=resolve_token(host, token), max_queue=max_queue, workers=workers,
                          deadline_ms=deadline_ms)
    output.note(f"loading and warming the tails of {bundle} ...")
    # The peer's tails have no fuse choice of their own: one thread each unless told otherwise.
    # Engine: the runtime layer's choice per variant (auto: fuse's, where its libraries run here).
    service = open_peer(bundle, options, threads=max(1, threads or 1), engine=engine or "auto",
                        trusted_key=trusted_key, rollback=rollback)
    engines = sorted({f"{ch.engine}" for ch in service.chains.values()})
    output.note(f"peer engines: {', '.join(engines)}" + "".join(f"; {a}: {n}" for a, ch in service.chains.items()
                                                                 for n in ch.notes if "not fuse's" in n))
    serve_peer(service, host, port, tls=tls, log_level="info" if debug else "warning",
               max_connections=max_connections, receipt_timeout_s=receipt_timeout_s,
               on_listening=lambda url: note_listening(output, bundle, f"peer serving {bundle} on {url} (POST "
                                                       "/v1/segment; SIGTERM drains and stops)"))
    output.result({"stopped": True, "role": "peer", "served": service.served},
                  f"peer stopped after {service.served} segments")


def run_device(output: Output, bundle: Path, *, peer: str, peer_token: str | None, peer_cafile: Path | None,
               session: Any, api: Any, server: Any, seed: int) -> None:
    from hmt.offload.session import PEER_TOKEN_ENV, PeerLink, serve_device_forever

    link = PeerLink(peer, token=peer_token or os.environ.get(PEER_TOKEN_ENV) or None, cafile=peer_cafile)
    for note in link.checked():
        output.warn(note)
    status = serve_device_forever(
        bundle, session, api, server, link, seed=seed,
        on_listening=lambda url: note_listening(output, bundle,
                                                f"serving {bundle} on {url}, offloading to {peer} when it pays"))
    offload = status.get("offload", {})
    output.result({"stopped": True, "status": status},
                  f"stopped; answered {offload.get('answered', {})}, peer errors {offload.get('peer_errors', {})}")
