"""Binding rules, the command's refusals, and the SIGTERM drain of a real ``hmt serve`` process."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import VariantDef, make_bundle, npy_bytes

from hmt.errors import UsageError
from hmt.serve.http.server import TOKEN_ENV, is_loopback, resolve_token

TOKEN = "s" * 20


def test_loopback_needs_no_token_anything_else_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert resolve_token("127.0.0.1", None) is None
    with pytest.raises(UsageError, match="not a loopback address"):
        resolve_token("0.0.0.0", None)
    with pytest.raises(UsageError, match="at least 16"):
        resolve_token("0.0.0.0", "short")
    assert resolve_token("0.0.0.0", TOKEN) == TOKEN
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert resolve_token("0.0.0.0", None) == TOKEN


@pytest.mark.parametrize("token", [" " * 24, "\t" * 20, "abcdefgh ijklmnopq", "tok\u00e9" * 5, "x" * 20 + "\n"])
def test_a_token_a_header_cannot_carry_is_refused_at_start(token: str) -> None:
    # A whitespace-only token used to be accepted and then refused every request.
    with pytest.raises(UsageError, match="printable ASCII"):
        resolve_token("0.0.0.0", token)


def _hmt(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.app", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_command_refuses_public_host_without_token_and_a_tampered_bundle(bundle_dir: Path, tmp_path: Path) -> None:
    env = {TOKEN_ENV: ""}
    done = _hmt("serve", str(bundle_dir), "--host", "0.0.0.0", env=env)
    assert done.returncode == 2 and "--token" in done.stderr
    tampered = tmp_path / "tampered"
    shutil.copytree(bundle_dir, tampered)
    (tampered / "variants/big/exit_0.onnx").write_bytes(b"changed")
    done = _hmt("serve", str(tampered), "--port", "0")
    assert done.returncode == 4 and "exit_0.onnx" in done.stderr
    done = _hmt("serve", str(tmp_path / "missing"), "--port", "0")
    assert done.returncode == 3


def test_sigterm_drains_requests_in_flight_then_exits_zero(tmp_path: Path) -> None:
    # Each request multiplies two 3072 x 3072 matrices (~0.4-0.8 s here): SIGTERM lands mid-request.
    bundle = make_bundle(tmp_path / "slow", [VariantDef("slow", 0.9, 1.0, 1.0, slow_n=3072)])
    # A generous deadline: on a loaded CI machine the queued request may wait seconds (a 504 is
    # the deadline doing its job, not a lost request, and is not what this test is about).
    proc = subprocess.Popen([sys.executable, "-m", "commands.app", "serve", str(bundle), "--port", "0",
                             "--workers", "2", "--deadline-ms", "120000", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        for _ in range(50):  # the "serving ... on URL" note (warnings may come first)
            seen.append(proc.stderr.readline())
            match = re.search(r"http://127\.0\.0\.1:(\d+)", seen[-1])
            if match or not seen[-1]:
                break
        assert match, seen
        port = int(match.group(1))
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/health/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.05)
        results: list[int] = []

        def post() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/v1/predict", body=npy_bytes(np.zeros((1, 4), np.float32)),
                      headers={"content-type": "application/x-npy"})
            response = c.getresponse()
            body = json.loads(response.read())
            results.append(response.status)
            assert body.get("variant") == "slow", body

        clients = [threading.Thread(target=post) for _ in range(3)]  # 2 running, 1 queued
        for c in clients:
            c.start()
        while True:  # SIGTERM once all three are admitted (two running, one queued)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/v1/status")
            if json.loads(conn.getresponse().read())["queue"]["admitted"] == 3:
                break
            assert time.monotonic() < deadline + 30, "requests never reached the server"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        for c in clients:
            c.join(30)
        assert results == [200, 200, 200]
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert json.loads(out)["status"]["requests"] == 3
        with pytest.raises(OSError):  # no longer listening
            http.client.HTTPConnection("127.0.0.1", port, timeout=2).request("GET", "/v1/health/live")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_health_without_token_over_a_real_process(bundle_dir: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "commands.app", "serve", str(bundle_dir), "--port", "0",
                             "--host", "127.0.0.1", "--health-without-token", "--receipt-timeout-s", "2",
                             "--max-connections", "32", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, TOKEN_ENV: TOKEN})
    try:
        assert proc.stderr is not None
        match = None
        for _ in range(50):
            line = proc.stderr.readline()
            match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if match or not line:
                break
        assert match
        port = int(match.group(1))
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/health/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/status")
        assert conn.getresponse().status == 401
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        doc = json.loads(conn.getresponse().read())
        assert doc["http"]["connections"]["max_connections"] == 32
        assert doc["http"]["connections"]["receipt_timeout_s"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
