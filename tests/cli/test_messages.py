"""The error printer prints what the message says: brackets are text, never rich markup."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import typer

from commands._output import Output
from commands.app import INTERNAL_ERROR_EXIT, cli, run_command
from hmt.errors import DeviceError, InputError


def _fail(exc: Exception) -> None:
    def body(output: Output) -> None:
        output.note('note: pip install "hmt[monsoon]" and [offline]')
        output.warn("a [red]warning[/red] with [/b]")
        raise exc

    run_command(body, json_mode=False)


@pytest.mark.parametrize("message", [
    'no Monsoon driver: pip install "hmt[monsoon]" (and libusb-1.0)',
    "runs/[/b]x: does not exist",
    "runs/[red]y[/red]: does not exist",
    "--torchvision needs torchvision: pip install 'hmt[offline]'",
])
def test_bracketed_messages_print_verbatim(message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised:
        _fail(InputError(message))
    assert raised.value.exit_code == 3
    captured = capsys.readouterr()
    assert f"error: {message}" in captured.err
    assert 'note: pip install "hmt[monsoon]" and [offline]' in captured.out
    assert "warning: a [red]warning[/red] with [/b]" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_exit_codes_stay_as_documented(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised:
        _fail(DeviceError("[monsoon] not found"))
    assert raised.value.exit_code == 7 and "error: [monsoon] not found" in capsys.readouterr().err
    with pytest.raises(typer.Exit) as raised:
        _fail(RuntimeError("a path with [/b] in it"))
    assert raised.value.exit_code == INTERNAL_ERROR_EXIT
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: a path with [/b] in it" in err and "Traceback" not in err


@pytest.mark.parametrize(("exc", "code", "kind"), [
    (InputError("runs/x: does not exist"), 3, "InputError"),
    (KeyboardInterrupt(), 130, "KeyboardInterrupt"),
    (RuntimeError("boom"), INTERNAL_ERROR_EXIT, "InternalError"),
    # a full or read-only disk is the user's environment: exit 3 naming the file, not "internal error"
    (OSError(errno.ENOSPC, "No space left on device", "runs/x/a.onnx"), 3, "InputError"),
    (OSError(errno.EROFS, "Read-only file system", "runs/x"), 3, "InputError"),
    (OSError(errno.EBADF, "Bad file descriptor"), INTERNAL_ERROR_EXIT, "InternalError"),
])
def test_json_mode_prints_one_error_document(exc: BaseException, code: int, kind: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def body(output: Output) -> None:
        output.note("a note goes to stderr")
        raise exc

    with pytest.raises(typer.Exit) as raised:
        run_command(body, json_mode=True)
    assert raised.value.exit_code == code
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # exactly one document: json.loads refuses trailing data
    assert doc["error"]["exit_code"] == code and doc["error"]["type"] == kind
    assert "Traceback" not in captured.err + captured.out


def test_json_mode_error_after_the_result_keeps_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    def body(output: Output) -> None:
        output.result({"out": "runs/x"})
        raise InputError("--push: host unreachable")

    with pytest.raises(typer.Exit):
        run_command(body, json_mode=True)
    assert json.loads(capsys.readouterr().out) == {"out": "runs/x"}


@pytest.mark.parametrize("argv", [["pareto", "--json", "--no-such-option"],
                                  ["pareto", "--json", "--evaluations", "many"]])
def test_json_mode_usage_errors_print_one_document(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli(argv)
    assert raised.value.code == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["exit_code"] == 2
    assert "Traceback" not in captured.err


def test_min_accuracy_given_as_a_fraction_is_refused_naming_the_percentage(capsys: pytest.CaptureFixture[str]) -> None:
    """--min-accuracy is in percent; 0.8 (a fraction, as manifests store accuracy) would keep everything."""
    with pytest.raises(SystemExit) as raised:
        cli(["convert", "--supernet", "hmt/data/embedded/supernet-cifar-resnet56", "--pareto", "no-such-front",
             "--min-accuracy", "0.8", "--out", "unused", "--json"])
    assert raised.value.code == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "give 80" in error["message"]



def test_sigterm_unwinds_a_command_like_ctrl_c(tmp_path: Path) -> None:
    """Python's default SIGTERM (timeout, systemd, docker stop) ended the process on the spot: no finally
    ran, so verify's archive extraction stayed in /tmp and a stage's temporary output beside --out."""
    import subprocess
    import sys

    marker = tmp_path / "cleaned"
    script = f"""
import os, signal, time
from commands.app import run_command
def body(output):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    finally:
        open({str(marker)!r}, "w").close()
try:
    run_command(body, json_mode=True)
except Exception as exc:  # typer.Exit
    raise SystemExit(exc.exit_code)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 143 and marker.exists(), (done.returncode, done.stderr[-500:])
    assert json.loads(done.stdout)["error"]["message"] == "terminated"


def test_json_stdout_holds_only_the_document_when_user_code_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """A user's model file that prints (at import, in its factory) does not break --json: the
    print goes to stderr, stdout holds the one document."""

    def body(output: Output) -> None:
        print("building my model...")
        output.result({"out": "runs/x"}, "wrote runs/x")

    run_command(body, json_mode=True)
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"out": "runs/x"}
    assert "building my model..." in captured.err

    def failing(output: Output) -> None:
        print("factory called")
        raise InputError("net.py: defines no function 'build'")

    with pytest.raises(typer.Exit):
        run_command(failing, json_mode=True)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["exit_code"] == 3 and "factory called" in captured.err
    run_command(body, json_mode=False)  # without --json, prints stay where they were
    assert "building my model..." in capsys.readouterr().out


NO_TORCH = """
import sys
sys.modules["torch"] = None  # a device install: pip install hmt, no offline extra
from commands.app import cli
cli(sys.argv[1:])
"""


@pytest.mark.parametrize("json_mode", [False, True])
def test_an_offline_stage_on_a_device_install_names_what_to_install(tmp_path: Path, json_mode: bool) -> None:
    # It was "internal error: ModuleNotFoundError: No module named 'torch' ... report it", exit 70.
    import subprocess
    import sys

    argv = ["train-supernet", "--preset", "tiny", "--out", str(tmp_path / "sn"), *(["--json"] if json_mode else [])]
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 7, done.stderr[-2000:]
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "error: this command needs torch" in done.stderr
    assert "pip install 'hmt[offline]'" in done.stderr
    if json_mode:
        assert json.loads(done.stdout)["error"]["type"] == "DeviceError"
