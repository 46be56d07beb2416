"""serve --blocks / --research end to end on a bundle deploy --blocks built from the shipped supernet: the pool
composes the bundled variants from shared blocks (counted once), the whole-variant graphs and the composed
chains agree on what they answer, and a variant re-search found joins the table and is chosen when only it fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.blocks.conftest import OTHER, SMALLEST, build_blocks_bundle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def blocks_bundle(tmp_path_factory: pytest.TempPathFactory, written_blocks: Any) -> Path:
    import torch

    torch.set_num_threads(1)
    return build_blocks_bundle(tmp_path_factory.mktemp("bundle"), [SMALLEST, OTHER],
                               data=written_blocks.root / "labelled.npz")


def test_deploy_blocks_bundle_verifies_and_lists_every_block(blocks_bundle: Path) -> None:
    import json

    from hmt.deploy.verify import verify_bundle

    listed = {f["path"] for f in json.loads((blocks_bundle / "manifest.json").read_text())["files"]}
    spec = json.loads((blocks_bundle / "blocks" / "blocks.json").read_text())
    assert {u["onnx"] for u in spec["units"]} <= listed and "blocks/calibration.npz" in listed
    assert set(spec["accuracy"]) == {SMALLEST, OTHER}
    assert all(c.status != "failed" for c in verify_bundle(blocks_bundle).checks)


def test_block_pool_serves_composed_variants_and_counts_shared_blocks_once(blocks_bundle: Path) -> None:
    from hmt.runtime.variant import load_variant
    from hmt.serve.running.session import SessionOptions, open_controller

    controller = open_controller(blocks_bundle, SessionOptions(blocks=True))
    controller.start(background=False)
    try:
        pool = controller.pool
        assert set(pool.loaded_ids()) == {SMALLEST, OTHER}
        footprints = sum(pool.space.footprint_bytes(pool.space.parse(a)) for a in (SMALLEST, OTHER))
        assert pool.loaded_bytes() < footprints  # the shared blocks counted once
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        # the composed chain (shared BN statistics) and the per-variant calibrated whole graph may differ in
        # their logits, but both are the same architecture: same exit, a class each
        whole = load_variant(controller.bundle, OTHER).run(x, None)
        composed = pool.get(OTHER).run(x, None)  # type: ignore[union-attr]
        assert composed.exit == whole.exit == 0
        status = controller.status()
        assert status["blocks"]["units_loaded"] <= status["blocks"]["units_shipped"]
        from hmt.serve.reporting.metrics import controller_metrics_text

        metrics = controller_metrics_text(controller)  # /metrics says what status says
        assert f"hmt_blocks_loaded {float(status['blocks']['units_loaded'])}" in metrics
        assert f"hmt_blocks_shipped {float(status['blocks']['units_shipped'])}" in metrics
        assert 'hmt_block_loads_total{event="load"}' in metrics and "hmt_blocks_resident_bytes" in metrics
    finally:
        controller.stop()


def test_found_variant_joins_the_table_and_is_chosen_when_only_it_fits(blocks_bundle: Path) -> None:
    from hmt.runtime.blocks import compose
    from hmt.serve.deciding.research import Measured, ResearchSettings
    from hmt.serve.deciding.research_join import adopt
    from hmt.serve.running.session import SessionOptions, open_controller

    controller = open_controller(blocks_bundle, SessionOptions(
        blocks=True, research=ResearchSettings(time_bound_s=1.0),
        serve_overrides={"switch": {"min_dwell_s": 0.0, "violation_patience": 1, "improve_patience": 1}}))
    controller.start(background=False)
    try:
        space = controller.pool.space
        choices = list(space.parse(OTHER).choices)
        choices[1] = "skip"  # SMALLEST's choice at s0.b0: in the sub-space, in neither bundled variant
        config = space.make([c if c != "-" else "base" for c in choices], 0)
        assert config.arch_id not in (SMALLEST, OTHER) and space.composable(config)
        runner = compose(controller.pool.store, config)
        tiny = 1e-3  # ms: below anything the bundled variants measure
        measured = Measured(config.arch_id, tiny / 2, tiny / 2, (tiny / 2,) * 8, space.footprint_bytes(config), True,
                            0.42, "calibration set, on the device")
        adopt(controller, measured, runner)
        assert config.arch_id in controller.pool.loaded_ids()
        table = {v.arch_id: v for v in controller.optimizer.variants}
        assert table[config.arch_id].accuracy == pytest.approx(0.42)  # no search ran: its own measure as it is
        controller.set_budgets(latency_ms=tiny, memory_mb=None)
        record = controller.tick()
        assert record.proposed == config.arch_id and record.feasible
        assert controller.active_arch_id == config.arch_id
        prediction = controller.predict(np.zeros((1, 3, 32, 32), dtype=np.float32))
        assert prediction.variant == config.arch_id
        assert controller.status()["research"]["searches"] == 0  # adopted by hand here: no search ran
        # The shadow runs read the extended table too: the found variant active, its neighbours are
        # known (they read the bundle's table alone before, and the loop thread died on its id).
        assert controller.shadow.optimizer is controller.optimizer
        assert controller.shadow.neighbours(config.arch_id) is not None
        controller.shadow.wanted(config.arch_id, 1.0)
    finally:
        controller.stop()


def test_the_loop_searches_only_when_nothing_fits_and_serves_meanwhile(blocks_bundle: Path) -> None:
    import time

    from hmt.serve.deciding.research import ResearchSettings
    from hmt.serve.running.session import SessionOptions, open_controller

    controller = open_controller(blocks_bundle, SessionOptions(
        blocks=True, research=ResearchSettings(time_bound_s=1.5, patience=2, min_gap_s=60.0, latency_runs=3)))
    controller.start(background=False)
    x = np.zeros((1, 3, 32, 32), dtype=np.float32)
    try:
        for _ in range(6):  # no budget: every variant fits
            controller.predict(x)
            controller.tick()
        assert controller.research.searches == 0
        controller.set_budgets(latency_ms=1e-3, memory_mb=None)  # nothing can fit (1 us: the least budget taken)
        started = None
        for _ in range(12):
            controller.predict(x)
            controller.tick()
            if controller.research.running:
                started = time.monotonic()
                break
        assert started is not None, controller.status()["research"]
        served = 0
        while controller.research.running:  # the current variant keeps answering meanwhile
            assert controller.predict(x).variant in (SMALLEST, OTHER)
            served += 1
        elapsed = time.monotonic() - started
        assert served > 0 and elapsed <= 1.5 + 2.5  # the bound, plus one candidate's load and timing on a busy CPU
        status = controller.status()["research"]
        assert status["searches"] == 1 and status["last"]["found"] is None and status["last"]["evaluated"] >= 1
        assert status["last"]["reason"] and status["last"]["started_s"] >= 0
        for _ in range(4):  # min_gap_s: no second search right after
            controller.predict(x)
            controller.tick()
        assert controller.research.searches == 1
        from hmt.serve.reporting.metrics import controller_metrics_text

        metrics = controller_metrics_text(controller)
        assert "hmt_research_searches_total 1.0" in metrics and "hmt_research_found_total 0.0" in metrics
        assert "hmt_research_running 0.0" in metrics
    finally:
        controller.stop()
