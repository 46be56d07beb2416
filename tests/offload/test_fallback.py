"""Two real processes on loopback: the device offloads, the peer is SIGKILLed, nothing fails.

The peer is ``hmt serve PEER --role peer`` in its own process; the device is an
:class:`OffloadDevice` in this one, forced to offload (``local_with_peer=False``) so that
every request really crosses the socket while the peer lives.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import INPUT_SHAPE

from hmt.bundle import load_bundle
from hmt.deploy.offload import OffloadBundles
from hmt.offload.client import PeerClient, PeerFailure
from hmt.offload.device import WHERE_FALLBACK, WHERE_PEER, DeviceOptions, OffloadDevice
from hmt.offload.plan import load_plan
from hmt.offload.planner import PlannerConfig

TOKEN = "k" * 32
REPO = Path(__file__).parents[2]
BUDGET_MS = 400.0  # generous: CI machines are shared; the assertions are about failures, not speed


def _start_peer(bundle: Path, port: int = 0, extra: tuple[str, ...] = (),
                cafile: Path | None = None) -> tuple[subprocess.Popen[str], str]:
    env = os.environ | {"PYTHONPATH": str(REPO), "HMT_SERVE_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "commands", "serve", str(bundle), "--role", "peer",
                             "--port", str(port), "--json", *extra], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        if "peer serving" in line:
            url = line.split(" on ")[1].split()[0]
            break
        if time.monotonic() > deadline:
            break
    else:
        raise AssertionError(f"peer did not start (exit {proc.poll()})")
    client = PeerClient(url, token=TOKEN, cafile=cafile)
    while True:
        try:
            client.call("GET", "/v1/health/ready", limit_ms=1000)
            return proc, url
        except PeerFailure:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)


@pytest.fixture()
def peer(offload_bundles: OffloadBundles) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, url = _start_peer(offload_bundles.peer)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def _device(offload_bundles: OffloadBundles, url: str, token: str) -> OffloadDevice:
    bundle = load_bundle(offload_bundles.device)
    device = OffloadDevice(bundle, load_plan(bundle), PeerClient(url, token=token),
                           DeviceOptions(budget_ms=BUDGET_MS, probe_interval_s=0.05, fixed_variant="deep"),
                           planner_config=PlannerConfig(local_with_peer=False, min_dwell_s=0.0),
                           rng=np.random.default_rng(0), warmup_runs=1)
    device.breaker.base_backoff_s = device.breaker.backoff_s = 0.1
    return device


def test_peer_killed_and_back_zero_failed_requests(offload_bundles: OffloadBundles,
                                                   peer: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = peer
    device = _device(offload_bundles, url, TOKEN)
    device.start()
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(INPUT_SHAPE).astype(np.float32) for _ in range(8)]
    chain = device.chains["deep"]
    expected = [chain.run_local(x, None).class_index for x in inputs]
    try:
        before = [device.predict(x) for x in inputs]
        assert [r.where for r in before] == [WHERE_PEER] * 8
        assert [r.class_index for r in before] == expected
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        after = [device.predict(x) for x in inputs]  # 0 failed: every one answered, correctly, in time
        assert [r.class_index for r in after] == expected
        assert after[0].where == WHERE_FALLBACK and after[0].latency_ms < BUDGET_MS
        assert all(r.where != WHERE_PEER for r in after) and device.breaker.opens >= 1
        port = int(url.rsplit(":", 1)[1])
        proc2, _ = _start_peer(offload_bundles.peer, port)  # the peer comes back on the same address
        try:
            deadline = time.monotonic() + 20
            back = []
            while time.monotonic() < deadline and not any(r.where == WHERE_PEER for r in back):
                back.append(device.predict(inputs[len(back) % 8]))
                time.sleep(0.02)
            assert back[-1].where == WHERE_PEER  # retried with backoff and used again
            assert all(r.class_index == expected[i % 8] for i, r in enumerate(back))
        finally:
            proc2.kill()
            proc2.wait(10)
    finally:
        device.stop()


def test_a_wrong_token_is_refused_and_the_device_answers_itself(offload_bundles: OffloadBundles,
                                                                 peer: tuple[subprocess.Popen[str], str]) -> None:
    _, url = peer
    device = _device(offload_bundles, url, "not-the-token-not-the-token")
    x = np.random.default_rng(2).standard_normal(INPUT_SHAPE).astype(np.float32)
    result = device.predict(x)
    assert result.where == WHERE_FALLBACK and result.peer_error == "http_401"
    assert result.class_index == device.chains["deep"].run_local(x, None).class_index
    assert device.errors["http_401"] == 1
    device.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_peer_with_a_verified_certificate(offload_bundles: OffloadBundles, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    proc, url = _start_peer(offload_bundles.peer, extra=("--ssl-certfile", str(cert), "--ssl-keyfile", str(key)),
                            cafile=cert)
    try:
        assert url.startswith("https://")
        device = _device(offload_bundles, url, TOKEN)
        device.client = PeerClient(url, token=TOKEN, cafile=cert)
        x = np.random.default_rng(3).standard_normal(INPUT_SHAPE).astype(np.float32)
        result = device.predict(x)
        assert result.where == WHERE_PEER
        assert result.class_index == device.chains["deep"].run_local(x, None).class_index
        with pytest.raises(PeerFailure):  # an unverified certificate is refused by the device
            PeerClient(url, token=TOKEN).status(2000)
        device.stop()
    finally:
        proc.kill()
        proc.wait(10)
