"""serve --peer decides through the controller's one decision (hmt.serve.deciding.joint): the memory
budget keeps a variant out of every route and off the device entirely."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import INPUT_SHAPE, make_conv_bundle

from hmt.deploy.offload import OffloadBundles, write_offload_bundles
from hmt.offload.session import PeerLink, open_device
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.running.session import SessionOptions


@pytest.fixture(scope="module")
def heavy_deep(tmp_path_factory: pytest.TempPathFactory) -> OffloadBundles:
    """deep (accurate) records 5 MB, shallow 1 MB."""
    root = tmp_path_factory.mktemp("joint")
    source = make_conv_bundle(root / "bundle", memory_mb={"deep": 5.0, "shallow": 1.0})
    return write_offload_bundles(source, root / "device", root / "peer", seed=3)


def _answers(bundles: OffloadBundles, options: SessionOptions, n: int = 6) -> tuple[list[str], dict]:
    # Nothing listens on port 9: the peer is out of reach, so local answers are all there is; what
    # is decided (and loaded) is what the budget allows.
    wrapped = open_device(bundles.device, options, PeerLink("http://127.0.0.1:9"), deadline_ms=2000.0)
    app = create_app(wrapped, ApiOptions(), on_shutdown=wrapped.stop)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    variants = []
    with TestClient(app) as client:
        wrapped.start()
        for _ in range(n):
            buf = io.BytesIO()
            np.save(buf, rng.standard_normal(INPUT_SHAPE).astype(np.float32))
            r = client.post("/v1/predict", content=buf.getvalue(), headers={"content-type": "application/x-npy"})
            assert r.status_code == 200, r.text
            variants.append(r.json()["variant"])
        status = client.get("/v1/status").json()
    return variants, status


def test_in_peer_mode_a_memory_budget_below_a_variants_footprint_keeps_that_variant_out(
        heavy_deep: OffloadBundles) -> None:
    # Without a memory budget the accurate variant is chosen and the device holds both.
    variants, status = _answers(heavy_deep, SessionOptions(latency_ms=500.0))
    assert {v.split("@")[0] for v in variants} == {"deep"}
    assert status["offload"]["loaded"] == ["deep", "shallow"]
    # 2 MB < deep's 5 MB: deep is neither loaded on the device nor chosen for any route.
    variants, status = _answers(heavy_deep, SessionOptions(latency_ms=500.0, memory_mb=2.0))
    assert {v.split("@")[0] for v in variants} == {"shallow"}
    assert status["offload"]["loaded"] == ["shallow"] and status["pool"]["loaded"] == ["shallow"]
    route = status["offload"]["route"]
    assert route["candidate"] == "shallow@local" and route["memory_bytes"] <= 2_000_000


def _tick_until(controller: Any, arch_id: str, timeout_s: float = 10.0) -> None:
    """Decisions until ``arch_id`` is active (the switcher waits out its violation patience and dwell)."""
    deadline = time.monotonic() + timeout_s
    while controller.active_arch_id != arch_id and time.monotonic() < deadline:
        controller.tick()
        time.sleep(0.05)


def test_a_memory_budget_tightened_at_run_time_releases_the_variant_on_the_device(
        heavy_deep: OffloadBundles) -> None:
    wrapped = open_device(heavy_deep.device, SessionOptions(latency_ms=500.0), PeerLink("http://127.0.0.1:9"),
                          deadline_ms=2000.0)
    controller = wrapped._controller
    wrapped.device.start()
    controller.start(background=False)
    try:
        assert controller.active_arch_id == "deep" and sorted(wrapped.device.chains) == ["deep", "shallow"]
        controller.set_budgets(500.0, 2.0)
        _tick_until(controller, "shallow")
        assert controller.active_arch_id == "shallow" and sorted(wrapped.device.chains) == ["shallow"]
        assert controller.route is not None and controller.route[0].arch_id == "shallow"
        # The budget lifted: the decision chooses deep again and the device loads it back.
        controller.set_budgets(500.0, None)
        _tick_until(controller, "deep")
        assert controller.active_arch_id == "deep" and "deep" in wrapped.device.chains
        x = np.random.default_rng(1).standard_normal(INPUT_SHAPE).astype(np.float32)
        assert wrapped.predict(x).variant.startswith("deep@")
    finally:
        wrapped.stop()
