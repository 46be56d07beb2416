"""``hmt serve`` on the Python edge boards ship (JetPack 5: 3.8), where the full command line cannot run.

The ``hmt`` command line is built on typer, which reads every option's annotation when it runs
(``str | None`` needs Python 3.10). Below 3.10 the console script (:mod:`commands.entry`) hands
its arguments here instead: ``hmt serve BUNDLE`` with the options a device needs (argparse, no
typer or rich), the same library calls as ``commands/serve.py`` and the same defaults (loopback,
a token for anything else). Every other subcommand is the offline half's, and says so in one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

DEVICE_COMMANDS = ("serve",)
USAGE_EXIT = 2
INTERRUPTED_EXIT = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hmt serve",
        description="Serve a bundle (hmt deploy's output, a directory or its .tar.gz) over HTTP: POST /v1/predict, "
                    "GET /v1/health/live|ready, /v1/status, /metrics, and the Open Inference Protocol (/v2). "
                    "Loopback by default; any other --host needs a token. SIGTERM or Ctrl-C drains and stops. "
                    "This is the device command line of Python < 3.10 (JetPack 5); on 3.10 or newer "
                    "hmt serve --help lists every option.")
    parser.add_argument("bundle", type=Path, help="the bundle directory or .tar.gz")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; anything but loopback needs a "
                        "token (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port, 0: any free one (default: %(default)s)")
    parser.add_argument("--token", default=None, help="Bearer token every request needs (default: $HMT_SERVE_TOKEN; "
                        ">= 16 characters)")
    parser.add_argument("--health-without-token", action="store_true",
                        help="let the health routes through without the token (orchestrator probes)")
    parser.add_argument("--latency-ms", type=float, default=None, help="latency budget in ms (overrides serve.json)")
    parser.add_argument("--memory-mb", type=float, default=None, help="memory budget in MB (overrides serve.json)")
    parser.add_argument("--exit-confidence", type=float, default=None,
                        help="early-exit softmax confidence threshold in (0, 1]")
    parser.add_argument("--no-early-exit", action="store_true", help="always run to the variant's exit")
    parser.add_argument("--variant", default=None, help="serve this variant only (no switching)")
    parser.add_argument("--threads", type=int, default=None, help="threads per inference (default: fuse's choice)")
    parser.add_argument("--workers", type=int, default=2, help="inferences at once (default: %(default)s)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests waiting at most (default: %(default)s)")
    parser.add_argument("--deadline-ms", type=float, default=2000.0,
                        help="a request not answered by then gets 504 (default: %(default)s)")
    parser.add_argument("--set", dest="set_", action="append", default=[], metavar="KEY=VALUE",
                        help="a serve.json setting, e.g. budgets.latency_ms=40 (repeatable)")
    parser.add_argument("--trusted-key", type=Path, default=None,
                        help="ed25519 public key (PEM): refuse a bundle not signed by it")
    parser.add_argument("--peer", default=None, help="offload to this peer (http(s)://HOST:PORT)")
    parser.add_argument("--peer-token", default=None, help="Bearer token the peer requires "
                        "(default: $HMT_PEER_TOKEN)")
    parser.add_argument("--peer-cafile", type=Path, default=None, help="CA bundle (PEM) to verify an https peer")
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="serve's log lines")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    return parser


def _serve(args: argparse.Namespace) -> Any:
    from hmt.serve.http.server import ServerOptions, resolve_token
    from hmt.serve.http.service import ApiOptions
    from hmt.serve.running.overrides import env_layer, set_layer
    from hmt.serve.running.session import SessionOptions, serve_forever

    def listening(url: str) -> None:
        sys.stderr.write(f"serving {args.bundle} on {url} (SIGTERM or Ctrl-C drains and stops)\n")
        sys.stderr.flush()

    session = SessionOptions(threads=args.threads, latency_ms=args.latency_ms, memory_mb=args.memory_mb,
                             exit_confidence=args.exit_confidence, no_early_exit=args.no_early_exit,
                             fixed_variant=args.variant, trusted_key=args.trusted_key,
                             layers=(env_layer(os.environ), set_layer(args.set_)))
    api = ApiOptions(token=resolve_token(args.host, args.token), max_queue=args.max_queue, workers=args.workers,
                     deadline_ms=args.deadline_ms, health_without_token=args.health_without_token)
    server = ServerOptions(host=args.host, port=args.port, log_level="info" if args.debug else "warning",
                           log_format=args.log_format)
    if args.peer is not None:
        from hmt.offload.session import PeerLink, serve_device_forever

        token = args.peer_token or os.environ.get("HMT_PEER_TOKEN") or None
        link = PeerLink(args.peer, token=token, cafile=args.peer_cafile)
        return serve_device_forever(args.bundle, session, api, server, link, on_listening=listening)
    return serve_forever(args.bundle, session, api, server, on_listening=listening)


def main(argv: list[str] | None = None) -> int:
    """``hmt`` below Python 3.10: ``serve`` runs, every other subcommand says where it runs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    version = ".".join(str(v) for v in sys.version_info[:3])
    if argv and argv[0] in ("--version", "-V"):
        from hmt import __version__

        sys.stdout.write(f"hmt {__version__} (device command line, Python {version})\n")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in DEVICE_COMMANDS:
        what = f"hmt {argv[0]}" if argv and not argv[0].startswith("-") else "the hmt command line"
        sys.stderr.write(f"hmt: on Python {version} only the device half runs: hmt serve BUNDLE (hmt serve --help); "
                         f"{what} needs Python 3.10 or newer (the offline half: train-supernet, profile-device, "
                         "pareto, convert, fuse, deploy)\n")
        return 0 if argv[:1] in (["-h"], ["--help"]) else USAGE_EXIT
    args = _parser().parse_args(argv[1:])
    from hmt.deploy.verify import check_archive_binding, opened_bundle
    from hmt.errors import HmtError

    try:
        # An archive is extracted (with verify's bounds) into a private folder removed on exit, as hmt serve does.
        with opened_bundle(args.bundle) as root:
            if root != args.bundle:
                check_archive_binding(args.bundle, root)
                sys.stderr.write(f"extracted {args.bundle} to a temporary folder; it is removed when serve stops\n")
            args.bundle = root
            status = _serve(args)
    except HmtError as exc:
        if args.debug:
            raise
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return INTERRUPTED_EXIT
    sys.stderr.write(f"stopped after {status.get('requests', 0)} requests, {status.get('switches', 0)} switches\n")
    return 0
