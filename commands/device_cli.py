"""``hmt serve`` on the Python edge boards ship (JetPack 5: 3.8), where the full command line cannot run.

The ``hmt`` command line is built on typer, which reads every option's annotation when it runs
(``str | None`` needs Python 3.10). Below 3.10 the console script (:mod:`commands.entry`) hands
its arguments here instead: ``hmt serve BUNDLE`` with the options a device needs (argparse, no
typer or rich), the same library calls as ``commands/serve.py`` and the same defaults (loopback,
a token for anything else), and the same error lines and exit codes. Every other subcommand is the
offline half's, and says so in one line. ``SERVE_ONLY_ON_310`` lists the full command line's serve
options left out here (tests/runtime/test_device_cli.py holds the two in step).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

DEVICE_COMMANDS = ("serve",)
USAGE_EXIT = 2
INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130

# Options of the full ``hmt serve`` (Python 3.10+) this command line does not offer: the scenario replay
# and its comparisons (a workstation's benchmark), the peer role (the stronger machine's side),
# adaptation and block composition, and the full command line's output modes.
SERVE_ONLY_ON_310 = frozenset({
    "--scenario", "--duration-s", "--clients", "--rate-hz", "--load", "--data", "--in-process",
    "--client-processes", "--timeline-out", "--compare", "--seed", "--role", "--ssl-certfile", "--ssl-keyfile",
    "--adapt", "--canary", "--adapt-unguarded", "--adapt-after", "--adapt-window", "--adapt-max-share",
    "--canary-tolerance", "--blocks", "--research", "--research-time-s", "--json", "--quiet"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hmt serve",
        description="Serve a bundle (hmt deploy's output, a directory or its .tar.gz) over HTTP: POST /v1/predict, "
                    "GET /v1/health/live|ready, /v1/status, /metrics, and the Open Inference Protocol (/v2). "
                    "Loopback by default; any other --host needs a token. SIGTERM or Ctrl-C drains and stops. "
                    "This is the device command line of Python < 3.10 (JetPack 5); on 3.10 or newer "
                    "hmt serve --help lists every option.")
    parser.add_argument("bundle", type=Path, help="the bundle directory or .tar.gz")
    _network_options(parser)
    _model_options(parser)
    _offload_options(parser)
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="serve's log lines")
    parser.add_argument("--access-log", action="store_true", help="log every request (on with --debug too)")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    return parser


def _network_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; anything but loopback needs a "
                        "token (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port, 0: any free one (default: %(default)s)")
    parser.add_argument("--token", default=None, help="Bearer token every request needs (default: $HMT_SERVE_TOKEN; "
                        ">= 16 characters)")
    parser.add_argument("--health-without-token", action="store_true",
                        help="let the health routes through without the token (orchestrator probes)")
    parser.add_argument("--workers", type=int, default=2, help="inferences at once (default: %(default)s)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests waiting at most (default: %(default)s)")
    parser.add_argument("--deadline-ms", type=float, default=2000.0,
                        help="a request not answered by then gets 504 (default: %(default)s)")
    parser.add_argument("--max-body-kb", type=int, default=None,
                        help="largest request body in KiB (default: from the input shape, at least 1 MiB)")
    parser.add_argument("--max-batch", type=int, default=64, help="most inputs in one request (default: %(default)s)")
    parser.add_argument("--max-connections", type=int, default=512,
                        help="most open connections (default: %(default)s)")
    parser.add_argument("--receipt-timeout-s", type=float, default=10.0,
                        help="seconds a client has to send a whole request, else 408 (default: %(default)s)")
    parser.add_argument("--dynamic-batch", type=int, default=1,
                        help="run up to N inputs arriving together as one batch (1: off, the default)")
    parser.add_argument("--dynamic-batch-delay-ms", type=float, default=2.0,
                        help="dynamic batching: longest wait for more inputs (default: %(default)s)")
    parser.add_argument("--model-name", default=None,
                        help="the model's name on /v2/models/NAME (default: the bundle directory's name)")


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--latency-ms", type=float, default=None, help="latency budget in ms (overrides serve.json)")
    parser.add_argument("--memory-mb", type=float, default=None, help="memory budget in MB (overrides serve.json)")
    parser.add_argument("--exit-confidence", type=float, default=None,
                        help="early-exit softmax confidence threshold in (0, 1]")
    parser.add_argument("--no-early-exit", action="store_true", help="always run to the variant's exit")
    parser.add_argument("--variant", default=None, help="serve this variant only (no switching)")
    parser.add_argument("--engine", choices=("auto", "onnxruntime", "tvm"), default=None,
                        help="runtime (default: serve.json's)")
    parser.add_argument("--threads", type=int, default=None, help="threads per inference (default: fuse's choice)")
    parser.add_argument("--providers", default=None,
                        help="ONNX Runtime execution providers to try in order, e.g. tensorrt,cuda,cpu "
                             "(default: the bundle target's)")
    parser.add_argument("--serve-config", type=Path, default=None,
                        help="JSON file shaped like serve.json (any subset) layered over the bundle's")
    parser.add_argument("--set", dest="set_", action="append", default=[], metavar="KEY=VALUE",
                        help="a serve.json setting, e.g. budgets.latency_ms=40 (repeatable)")
    parser.add_argument("--trusted-key", type=Path, default=None,
                        help="ed25519 public key (PEM): refuse a bundle not signed by it")
    parser.add_argument("--allow-rollback", action="store_true",
                        help="with --trusted-key: accept a release older than one this key already had served")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where the newest signed release per key is recorded (default: $HMT_STATE_DIR, "
                             "else $XDG_STATE_HOME/hmt, else ~/.local/state/hmt)")


def _offload_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peer", default=None, help="offload to this peer (http(s)://HOST:PORT)")
    parser.add_argument("--peer-token", default=None, help="Bearer token the peer requires "
                        "(default: $HMT_PEER_TOKEN)")
    parser.add_argument("--peer-cafile", type=Path, default=None, help="CA bundle (PEM) to verify an https peer")


def _note(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _listening(args: argparse.Namespace, url: str, suffix: str) -> None:
    """The address, then (as the full command line) a note for a bundle built for another CPU architecture."""
    import platform

    from hmt.bundle import foreign_machine_note, load_bundle

    _note(f"serving {args.bundle} on {url}{suffix}")
    note = foreign_machine_note(load_bundle(args.bundle, verify_checksums=False), platform.machine())
    if note is not None:
        _note(f"note: {note}")


def _options(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """SessionOptions, ApiOptions and ServerOptions as commands/serve.py builds them."""
    from commands._checks import check_budget_flags
    from hmt.artifacts.rollback import RollbackPolicy
    from hmt.errors import UsageError
    from hmt.runtime.ort import parse_providers
    from hmt.serve.http.server import ServerOptions, resolve_token
    from hmt.serve.http.service import ApiOptions
    from hmt.serve.running.overrides import env_layer, file_layer, set_layer
    from hmt.serve.running.session import SessionOptions

    check_budget_flags(latency_ms=args.latency_ms, memory_mb=args.memory_mb)
    if args.trusted_key is None and (args.allow_rollback or args.state_dir is not None):
        raise UsageError("--allow-rollback and --state-dir go with --trusted-key (only signed releases are ordered)")
    layers = (*([file_layer(args.serve_config)] if args.serve_config is not None else []),
              env_layer(os.environ), set_layer(args.set_))
    session = SessionOptions(engine=args.engine, threads=args.threads, latency_ms=args.latency_ms,
                             memory_mb=args.memory_mb, exit_confidence=args.exit_confidence,
                             no_early_exit=args.no_early_exit, fixed_variant=args.variant,
                             trusted_key=args.trusted_key,
                             rollback=RollbackPolicy(state_dir=args.state_dir, allow=args.allow_rollback),
                             providers=parse_providers(args.providers), layers=layers)
    api = ApiOptions(token=resolve_token(args.host, args.token), max_queue=args.max_queue, workers=args.workers,
                     deadline_ms=args.deadline_ms, health_without_token=args.health_without_token,
                     max_body_bytes=None if args.max_body_kb is None else args.max_body_kb * 1024,
                     max_batch=args.max_batch, model_name=args.model_name, dynamic_batch=args.dynamic_batch,
                     dynamic_batch_delay_ms=args.dynamic_batch_delay_ms)
    server = ServerOptions(host=args.host, port=args.port, log_level="info" if args.debug else "warning",
                           access_log=args.access_log or args.debug, log_format=args.log_format,
                           max_connections=args.max_connections, receipt_timeout_s=args.receipt_timeout_s)
    return session, api, server


def _serve(args: argparse.Namespace) -> Any:
    from hmt.serve.running.session import serve_forever

    session, api, server = _options(args)
    if args.peer is not None:
        from hmt.offload.session import PEER_TOKEN_ENV, PeerLink, serve_device_forever

        token = args.peer_token or os.environ.get(PEER_TOKEN_ENV) or None
        link = PeerLink(args.peer, token=token, cafile=args.peer_cafile)
        for warning in link.checked():  # refuses a peer off loopback without its token, as the full command line
            _note(f"warning: {warning}")
        return serve_device_forever(args.bundle, session, api, server, link, on_listening=lambda url: _listening(
            args, url, f", offloading to {args.peer} when it pays"))
    return serve_forever(args.bundle, session, api, server, on_listening=lambda url: _listening(
        args, url, " (SIGTERM or Ctrl-C drains and stops)"))


def _run(args: argparse.Namespace) -> Any:
    from hmt.deploy.verify import check_archive_binding, opened_bundle

    # An archive is extracted (with verify's bounds) into a private folder removed on exit, as hmt serve does.
    with opened_bundle(args.bundle) as root:
        if root != args.bundle:
            check_archive_binding(args.bundle, root)
            _note(f"extracted {args.bundle} to a temporary folder; it is removed when serve stops")
        args.bundle = root
        return _serve(args)


def _failed(exc: BaseException, debug: bool) -> int:
    """One line and the exit code for what ended serve, as commands/app.py reports it (traceback: --debug)."""
    from hmt.errors import STORAGE_ERRNOS, HmtError, InputError, storage_error_message

    if debug and not isinstance(exc, KeyboardInterrupt):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    if isinstance(exc, KeyboardInterrupt):
        _note("interrupted")
        return INTERRUPTED_EXIT
    if isinstance(exc, HmtError):
        _note(f"error: {exc}")
        return exc.exit_code
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:  # a full, read-only or forbidden disk
        _note(f"error: {storage_error_message(exc)}")
        return InputError.exit_code
    _note(f"internal error: {type(exc).__name__}: {exc}\nrerun with --debug for the traceback, and report it")
    return INTERNAL_ERROR_EXIT


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
    try:
        status = _run(args)
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the one place serve's failures are reported
        return _failed(exc, args.debug)
    _note(f"stopped after {status.get('requests', 0)} requests, {status.get('switches', 0)} switches")
    return 0
