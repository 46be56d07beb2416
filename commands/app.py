"""Wiring of the ``hmt`` command line, and the one place errors become exit codes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console

from commands._output import Output, error_document, styled, write_json_document
from hmt import __version__
from hmt.errors import STORAGE_ERRNOS, DeviceError, HmtError, InputError, storage_error_message

T = TypeVar("T")

INTERNAL_ERROR_EXIT = 70
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report a Ctrl-C
TERMINATED_EXIT = 143  # 128 + SIGTERM
# The top-level modules of the offline extra (pyproject's [offline]): a device install (`pip install hmt`)
# has none of them, so an offline stage run there is missing one; that is the install's, not a bug.
OFFLINE_MODULES = frozenset({"torch", "torchvision", "onnx", "onnxscript", "onnxsim", "onnxslim", "tvm", "tvm_ffi",
                             "safetensors", "pandas", "matplotlib", "scipy", "pymoo", "tornado", "pynvml",
                             "cloudpickle"})


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, systemd, docker stop, a cancelled CI job), raised like a Ctrl-C so that every
    ``finally`` and ``with`` runs: Python's default SIGTERM ended the process on the spot, leaving an
    archive extracted for verify in /tmp and a stage's temporary output behind."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()

app = typer.Typer(
    name="hmt",
    help=(
        "Port a deep-learning model to heterogeneous, changing edge devices.\n\n"
        "Offline: train-supernet -> profile-device -> pareto -> convert -> fuse -> deploy.\n"
        "Online: serve. Each stage reads earlier artifacts by path and writes a directory\n"
        "with a checksummed manifest.json.\n\n"
        "Example (the embedded default, a few minutes on a laptop CPU):\n\n"
        "  hmt train-supernet --preset tiny --out runs/supernet"
    ),
    no_args_is_help=True,
    # `hmt --install-completion` / `--show-completion` (bash, zsh, fish, PowerShell).
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"hmt {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Show the version."
    ),
) -> None:
    """hmt command line."""


def run_command(body: Callable[[Output], T], *, json_mode: bool, quiet: bool = False, debug: bool = False) -> T:
    """Run a command body, mapping hmt's typed errors to a message and an exit code.

    Tracebacks are shown only with --debug or HMT_DEBUG=1.
    """
    output = Output(json_mode=json_mode, quiet=quiet)
    show_trace = debug or os.environ.get("HMT_DEBUG", "") not in ("", "0")
    err = Console(file=sys.stderr, highlight=False, soft_wrap=True)
    with _sigterm_unwinds():
        return _run_body(body, output, err, show_trace)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` while a command runs (where the handler is Python's default)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_body(body: Callable[[Output], T], output: Output, err: Console, show_trace: bool) -> T:
    try:
        # --json: stdout holds the one document; what else prints there while the command runs
        # (a user's model file, a library) goes to stderr.
        with contextlib.redirect_stdout(sys.stderr) if output.json_mode else contextlib.nullcontext():
            return body(output)
    except HmtError as exc:
        _error(exc, err, output, show_trace)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in OFFLINE_MODULES:
            _internal_error(exc, err, output, show_trace)
        _error(DeviceError(f"this command needs {exc.name}, which is not installed here: it is part of hmt's "
                           "offline half (pip install 'hmt[offline]'); a device install has only what serve needs"),
               err, output, show_trace)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        what, code = ("terminated", TERMINATED_EXIT) if terminated else ("interrupted", INTERRUPTED_EXIT)
        err.print(what)
        output.error(what, code, type(exc).__name__)
        raise typer.Exit(code) from None
    except typer.Exit:
        raise
    except OSError as exc:
        if exc.errno not in STORAGE_ERRNOS:  # a full, read-only or forbidden disk is the user's, not a bug
            _internal_error(exc, err, output, show_trace)
        if show_trace:
            traceback.print_exc()
        message = storage_error_message(exc)
        err.print(styled("error:", "bold red", message))
        output.error(message, InputError.exit_code, "InputError")
        raise typer.Exit(InputError.exit_code) from None
    except Exception as exc:  # noqa: BLE001 - the one place unexpected errors are reported
        _internal_error(exc, err, output, show_trace)


def _error(exc: HmtError, err: Console, output: Output, show_trace: bool) -> NoReturn:
    if show_trace:
        traceback.print_exc()
    err.print(styled("error:", "bold red", str(exc)))
    output.error(str(exc), exc.exit_code, type(exc).__name__)
    raise typer.Exit(exc.exit_code) from None


def _internal_error(exc: Exception, err: Console, output: Output, show_trace: bool) -> NoReturn:
    if show_trace:
        traceback.print_exc()
    err.print(styled("internal error:", "bold red", f"{type(exc).__name__}: {exc}\n"
                     "rerun with --debug for the traceback, and report it"))
    output.error(f"internal error: {type(exc).__name__}: {exc}", INTERNAL_ERROR_EXIT, "InternalError")
    raise typer.Exit(INTERNAL_ERROR_EXIT) from None


COMMAND_MODULES = ("train_supernet", "specialize", "profile_device", "convert", "fuse", "pareto", "deploy", "serve",
                   "adapt")


def _register() -> None:
    # Each command module adds itself to ``app``; imports stay light (no torch) so
    # ``hmt --help`` is instant.
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"commands.{name}")


# click's base error, from the click typer raises (typer 0.29 on: a copy of its own, not the click package).
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def cli(argv: list[str] | None = None) -> Any:
    _register()
    args = sys.argv[1:] if argv is None else list(argv)
    if "--json" not in args:
        return app(args=args)
    # --json: a usage error click reports before the command runs (an unknown option, a bad
    # value) still leaves one JSON document on stdout.
    try:
        code = app(args=args, standalone_mode=False)
    except _CLICK_ERROR as exc:
        error: Any = exc  # click's ClickException: show(), exit_code, format_message()
        error.show()
        write_json_document(error_document(error.format_message(), int(error.exit_code), "UsageError"))
        sys.exit(int(error.exit_code))
    except typer.Abort:
        sys.stderr.write("interrupted\n")
        write_json_document(error_document("interrupted", INTERRUPTED_EXIT, "KeyboardInterrupt"))
        sys.exit(INTERRUPTED_EXIT)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    # Run through the imported module so command modules register on the same ``app``.
    from commands.app import cli as _cli

    _cli()
