"""The device command line (``hmt serve`` below Python 3.10, :mod:`commands.device_cli`) keeps in step
with the full one: the same serve options (but the listed workstation-only ones), the same notes, and the
same one-line errors and exit codes. It is plain argparse, so these run on any Python."""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Any

import pytest

from commands import device_cli

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))

from serve_bundles import make_bundle


def _full_serve_options() -> set[str]:
    import typer

    from commands.app import _register, app

    _register()
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts if opt.startswith("--")}


def _device_options() -> set[str]:
    return {opt for action in device_cli._parser()._actions for opt in action.option_strings if opt.startswith("--")}


def test_the_device_command_line_offers_every_serve_option_but_the_workstation_ones() -> None:
    full, device = _full_serve_options(), _device_options()
    missing = full - device - device_cli.SERVE_ONLY_ON_310
    assert not missing, f"hmt serve options the Python 3.8 command line lacks: {sorted(missing)}"
    assert not (device_cli.SERVE_ONLY_ON_310 - full), "SERVE_ONLY_ON_310 names options hmt serve does not have"
    assert not (device - full - {"--help"}), sorted(device - full)


@pytest.fixture
def fake_serve(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """serve_forever replaced by one that announces its URL and returns at once; records its arguments."""
    import hmt.serve.running.session as session

    calls: list[Any] = []

    def serve_forever(bundle: Path, options: Any, api: Any, server: Any, on_listening: Any = None) -> dict[str, Any]:
        calls.append((bundle, options, api, server))
        on_listening("http://127.0.0.1:1")
        return {"requests": 0, "switches": 0}

    monkeypatch.setattr(session, "serve_forever", serve_forever)
    return calls


def test_a_bundle_for_another_architecture_gets_the_full_command_lines_note(
        tmp_path: Path, fake_serve: list[Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import platform

    bundle = make_bundle(tmp_path / "bundle", target={"name": "raspberry-pi-4b", "arch": "aarch64"})
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert device_cli.main(["serve", str(bundle), "--port", "0"]) == 0
    err = capsys.readouterr().err
    assert "note: " in err and "built for raspberry-pi-4b (aarch64) and this machine is x86_64" in err, err


def test_settings_file_rollback_state_and_http_limits_reach_serve(
        tmp_path: Path, fake_serve: list[Any]) -> None:
    bundle = make_bundle(tmp_path / "bundle")
    config = tmp_path / "serve-config.json"
    config.write_text('{"budgets": {"latency_ms": 40}}')
    key = tmp_path / "k.pub"
    key.write_text("unused: serve_forever is replaced")
    assert device_cli.main(["serve", str(bundle), "--serve-config", str(config), "--providers", "cpu",
                            "--trusted-key", str(key), "--state-dir", str(tmp_path / "state"), "--allow-rollback",
                            "--max-batch", "4", "--model-name", "m", "--access-log"]) == 0
    (_, session, api, server), = fake_serve
    assert next(layer.source for layer in session.layers).startswith("--serve-config")
    assert session.providers == ("cpu",) and session.rollback.allow
    assert session.rollback.state_dir == tmp_path / "state"
    assert api.max_batch == 4 and api.model_name == "m" and server.access_log


@pytest.mark.parametrize(("argv", "expected"), [
    (["--latency-ms", "-5"], "--latency-ms -5: expected a finite number > 0"),
    (["--state-dir", "x"], "--allow-rollback and --state-dir go with --trusted-key"),
    (["--peer", "http://192.0.2.7:9000"], "--peer http://192.0.2.7:9000 is off loopback: pass --peer-token"),
])
def test_bad_values_are_one_line_and_exit_2(argv: list[str], expected: str, tmp_path: Path, fake_serve: list[Any],
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HMT_PEER_TOKEN", raising=False)
    bundle = make_bundle(tmp_path / "bundle")
    assert device_cli.main(["serve", str(bundle), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and len(err.strip().splitlines()) == 1, err
    assert not fake_serve


@pytest.mark.parametrize(("raised", "code", "expected"), [
    (OSError(errno.ENOSPC, "No space left on device", "/state/signed-releases.json"), 3,
     "error: /state/signed-releases.json: No space left on device"),
    (RuntimeError("boom"), 70, "internal error: RuntimeError: boom"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_what_ends_serve_is_one_line_without_a_traceback(raised: BaseException, code: int, expected: str,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import hmt.serve.running.session as session

    def serve_forever(*args: Any, **kwargs: Any) -> Any:
        raise raised

    monkeypatch.setattr(session, "serve_forever", serve_forever)
    bundle = make_bundle(tmp_path / "bundle")
    assert device_cli.main(["serve", str(bundle)]) == code
    err = capsys.readouterr().err
    assert err.startswith(expected) and "Traceback" not in err, err
