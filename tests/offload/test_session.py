"""``hmt serve BUNDLE --peer URL`` in process: the device API answers through the offload path."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from hmt.deploy.offload import OffloadBundles
from hmt.offload.session import PeerLink, open_device
from hmt.runtime.chain import ChainRunner
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.running.session import SessionOptions


def test_device_api_with_an_unreachable_peer_answers_every_request(offload_bundles: OffloadBundles,
                                                                   tmp_path: Path) -> None:
    wrapped = open_device(offload_bundles.device, SessionOptions(latency_ms=500.0),
                          PeerLink("http://127.0.0.1:9"), deadline_ms=2000.0)  # nothing listens on port 9
    wrapped.start()
    app = create_app(wrapped, ApiOptions(), on_shutdown=wrapped.stop)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    with TestClient(app) as client:
        for _ in range(5):
            buf = io.BytesIO()
            np.save(buf, rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
            r = client.post("/v1/predict", content=buf.getvalue(), headers={"content-type": "application/x-npy"})
            assert r.status_code == 200, r.text
            assert "@local" in r.json()["variant"]  # the breaker is open: the planner keeps it here
        status = client.get("/v1/status").json()
    offload = status["offload"]
    assert offload["breaker"]["state"] in ("open", "half_open") and offload["answered"] == {"local": 5}
    assert offload["peer_errors"].get("probe_refused", 0) + offload["peer_errors"].get("probe_broken", 0) >= 1


def test_remote_factor_is_a_recent_tail(offload_bundles: OffloadBundles) -> None:
    from hmt.bundle import load_bundle
    from hmt.offload.client import PeerClient
    from hmt.offload.device import DeviceOptions, OffloadDevice
    from hmt.offload.plan import load_plan

    now = [100.0]
    bundle = load_bundle(offload_bundles.device)
    device = OffloadDevice(bundle, load_plan(bundle), PeerClient("http://127.0.0.1:9"),
                           DeviceOptions(budget_ms=50.0, remote_window_s=10.0), rng=np.random.default_rng(0),
                           clock=lambda: now[0], warmup_runs=1)
    assert device.remote_factor() == 1.0
    for ratio in (1.0, 1.2, 1.1, 3.0, 1.0, 1.3, 1.1, 1.0, 1.2, 4.0):
        device._remote_ratios.append((now[0], ratio))
    assert 3.0 <= device.remote_factor() <= 4.0  # the 90th percentile, not the mean
    now[0] += 11.0  # all older than the window: the peer gets a fresh chance
    assert device.remote_factor() == 1.0
    device.stop()


def test_served_and_offloaded_variants_share_their_sessions(offload_bundles: OffloadBundles) -> None:
    # Before: serve's pool loaded every variant and the offload device loaded it again.
    wrapped = open_device(offload_bundles.device, SessionOptions(latency_ms=500.0),
                          PeerLink("http://127.0.0.1:9"), deadline_ms=2000.0)
    controller = wrapped._controller
    controller.start(background=False)
    try:
        assert sorted(controller.pool.loaded_ids()) == sorted(wrapped.device.chains)
        for arch_id, chain in wrapped.device.chains.items():
            runner = controller.pool.get(arch_id)
            assert isinstance(runner, ChainRunner) and runner.engine == chain.engine
            assert all(a is b for a, b in zip(runner._segments, chain._segments, strict=True))
            assert all(a is b for a, b in zip(runner._exits, chain._exits, strict=True))
    finally:
        controller.stop()


def test_tvm_built_for_another_machine_runs_on_onnxruntime(offload_bundles: OffloadBundles,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from hmt.bundle import load_bundle
    from hmt.errors import ModelError
    from hmt.offload import parts

    bundle = load_bundle(offload_bundles.peer)
    variant = bundle.spec.variant("deep")
    # Any file of the bundle stands in for a library: only its ELF header is read, patched here.
    tvm_variant = replace(variant, engines=("onnxruntime", "tvm"), preferred_engine="tvm",
                          segments=tuple(replace(g, tvm=g.onnx) for g in variant.segments))
    monkeypatch.setattr(parts, "resolve_engine", lambda requested, v: "tvm")

    class Header:
        machine = "aarch64"

    monkeypatch.setattr("hmt.deploy.elf.read_elf_header", lambda path: Header())
    monkeypatch.setattr("hmt.deploy.targets.host_arch", lambda: "x86_64")
    engine, notes = parts.chain_engine(bundle, tvm_variant, "auto")
    assert engine == "onnxruntime" and "built for aarch64" in notes[0]
    with pytest.raises(ModelError, match="--engine tvm"):
        parts.chain_engine(bundle, tvm_variant, "tvm")
    Header.machine = "x86_64"
    assert parts.chain_engine(bundle, tvm_variant, "auto") == ("tvm", [])


def test_a_peer_off_loopback_needs_its_token_and_plain_http_there_is_noted() -> None:
    import pytest

    from hmt.errors import UsageError

    assert PeerLink("http://127.0.0.1:8001").checked() == []
    assert PeerLink("http://localhost:8001").checked() == []
    with pytest.raises(UsageError, match="off loopback: pass --peer-token"):
        PeerLink("http://10.0.0.7:8001").checked()
    (note,) = PeerLink("http://10.0.0.7:8001", token="t" * 24).checked()
    assert "unencrypted" in note
    assert PeerLink("https://peer.example:8001", token="t" * 24).checked() == []
    with pytest.raises(UsageError, match="expected http://HOST:PORT"):
        PeerLink("10.0.0.7:8001").checked()
