"""The error printer prints what the message says: brackets are text, never rich markup."""

from __future__ import annotations

import pytest
import typer

from commands._output import Output
from commands.app import INTERNAL_ERROR_EXIT, run_command
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
