"""The systemd unit and the container recipe in scripts/device/: their command lines, run as written (paths
swapped for a tiny signed bundle), serve a bundle that answers /v2/health/ready, log JSON, and drain on SIGTERM."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from hmt.artifacts import load_artifact
from hmt.artifacts.signing import generate_key_pair, load_private_key, sign_artifact_dir

ROOT = Path(__file__).parents[2]
UNIT = ROOT / "scripts" / "device" / "systemd" / "hmt-serve.service"
DOCKERFILE = ROOT / "scripts" / "device" / "docker" / "Dockerfile"
TOKEN = "recipe-token-" + "r" * 16


def unit_command(path: Path) -> list[str]:
    section = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line
        elif section == "[Service]" and line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):])
    raise AssertionError(f"{path}: no ExecStart in [Service]")


def dockerfile_command(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    assert len(lines) == 1, lines
    command = json.loads(lines[0][len("ENTRYPOINT "):])
    assert isinstance(command, list) and all(isinstance(a, str) for a in command)
    return command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def localise(argv: list[str], bundle: Path, public_key: Path, port: int) -> list[str]:
    """The recipe's command with its install paths replaced by the test's (nothing else changes)."""
    assert Path(argv[0]).name == "hmt" and argv[1] == "serve", argv
    out = [sys.executable, "-m", "commands", "serve"]
    swaps = {"/var/lib/hmt/bundle": str(bundle), "/bundle": str(bundle), "/etc/hmt/bundle.pub": str(public_key)}
    args = argv[2:]
    for i, arg in enumerate(args):
        out.append(str(port) if i and args[i - 1] == "--port" else swaps.get(arg, arg))
    return out


def get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_recipes_run_the_same_server() -> None:
    unit, docker = unit_command(UNIT), dockerfile_command(DOCKERFILE)
    flags = {a for a in unit if a.startswith("--")}
    assert {"--host", "--port", "--health-without-token", "--log-format"} <= flags
    assert {a for a in docker if a.startswith("--")} <= flags | {"--trusted-key"}


def _unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not line.lstrip().startswith("#"):
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.parametrize("recipe", ["systemd", "docker"])
def test_the_recipes_command_line_parses_on_the_python38_device_command_line(recipe: str) -> None:
    """JetPack 5 boards run Python 3.8, where `hmt serve` is commands/device_cli.py: the unit's --access-log
    was not one of its options, so the service failed at start there."""
    from commands.device_cli import _parser

    argv = unit_command(UNIT) if recipe == "systemd" else dockerfile_command(DOCKERFILE)
    _parser().parse_args([*argv[2:], "--trusted-key", "/etc/hmt/bundle.pub"])


def test_the_unit_gives_the_roll_back_state_a_writable_folder() -> None:
    """ProtectSystem=strict and ProtectHome leave serve nowhere to record the signed releases --trusted-key
    needs (~/.local/state/hmt is read-only): it refused to start. The state goes to the StateDirectory."""
    settings = _unit_settings(UNIT)
    assert "--trusted-key" in unit_command(UNIT) and settings.get("ProtectSystem") == ["strict"]
    state = [v.partition("=")[2] for v in settings.get("Environment", []) if v.startswith("HMT_STATE_DIR=")]
    assert state and settings.get("StateDirectory") == ["hmt-serve"] and state[0] == "/var/lib/hmt-serve"
    assert any(line.startswith("ENV HMT_STATE_DIR=") for line in DOCKERFILE.read_text().splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["systemd", "docker"])
def test_the_recipes_command_line_serves_a_bundle(recipe: str, bundle_dir: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir, bundle)
    private, public = generate_key_pair(tmp_path / "keys" / "bundle.pem")
    sign_artifact_dir(bundle, load_artifact(bundle, kind="bundle").manifest_sha256, load_private_key(private))
    argv = unit_command(UNIT) if recipe == "systemd" else dockerfile_command(DOCKERFILE)
    port = free_port()
    command = localise(argv, bundle, public, port)
    env = {**os.environ, "HMT_SERVE_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "HMT_SERVE_BUDGETS__LATENCY_MS": "500"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if get(base + "/v2/health/ready") == 200:  # open to probes: --health-without-token
                    break
            except OSError:
                pass
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "not ready within 90 s"
            time.sleep(0.2)
        assert get(base + "/v2/models/bundle/ready") == 401  # everything else needs the token
        assert get(base + "/v2/models/bundle/ready", TOKEN) == 200
        with urllib.request.urlopen(urllib.request.Request(base + "/v1/status", headers={
                "Authorization": f"Bearer {TOKEN}"}), timeout=5) as response:
            status = json.loads(response.read())
        assert status["settings"]["budgets.latency_ms"] == {"value": 500, "source": "environment"}
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    if recipe == "systemd":  # --access-log: one JSON record per request, with its fields
        assert any(r.get("logger") == "uvicorn.access" and r.get("status") == 401 for r in records), err


def test_json_log_records() -> None:
    import logging

    from hmt.serve.http.logs import JsonFormatter, logging_config

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "POST", "/v2/models/m/infer", "1.1", 200), None)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["status"] == 200 and doc["path"] == "/v2/models/m/infer" and doc["level"] == "info"
    assert doc["message"] == '127.0.0.1:5000 - "POST /v2/models/m/infer HTTP/1.1" 200' and doc["ts"].endswith("+00:00")
    assert logging_config(access_log=False)["loggers"]["uvicorn.access"]["handlers"] == []
    from hmt.errors import UsageError

    with pytest.raises(UsageError, match="--log-format"):
        logging_config(log_format="xml")
