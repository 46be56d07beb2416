"""Real memory pressure reaches the loop (issue 28): serve.json memory_reserve_mb cuts the memory budget
to the loaded variants plus the available memory above the reserve; a scenario's memory squeeze lowers
that reading."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_bundles import VariantDef, make_bundle

from hmt.bundle import load_bundle
from hmt.errors import UsageError
from hmt.runtime.settings import Budgets, ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.deciding.free_memory import FreeMemory
from hmt.serve.deciding.monitor import ResourceSample
from hmt.serve.running.scenario import Scenario, ScenarioSampler, ScenarioState

GB = 1_000_000_000


def sample(available_mb: float) -> ResourceSample:
    return ResourceSample(0.0, 0.0, int(available_mb * 1e6), 8 * GB)


def test_a_cut_applies_at_once_and_a_rise_after_the_hold() -> None:
    free = FreeMemory(reserve_mb=1000.0, hold_s=0.5)
    assert free.update(0.0, sample(1500.0), loaded_bytes=2_000_000) == pytest.approx(502.0)
    assert free.update(0.25, sample(900.0), loaded_bytes=2_000_000) == 0.0  # below the reserve: nothing
    assert free.cap(Budgets(latency_ms=5.0, memory_mb=50.0)) == Budgets(latency_ms=5.0, memory_mb=0.0)
    assert free.update(0.5, sample(1500.0), loaded_bytes=2_000_000) == 0.0  # the cut held 0.25 s only
    assert free.update(1.0, sample(1500.0), loaded_bytes=2_000_000) == pytest.approx(502.0)
    # Under the configured budget, the configured one stands.
    assert free.cap(Budgets(memory_mb=10.0)).memory_mb == 10.0
    assert FreeMemory(None).update(0.0, sample(1.0), 0) is None


def test_a_release_is_back_at_the_first_reading_after_it() -> None:
    """No hold by default: a squeeze released between two readings is back at the first reading
    after the release (the switcher's patience and dwell keep flicker out); a hold, where set,
    still waits."""
    free = FreeMemory(reserve_mb=1000.0)
    assert free.update(0.0, sample(900.0), loaded_bytes=2_000_000) == 0.0
    assert free.update(0.25, sample(1500.0), loaded_bytes=2_000_000) == pytest.approx(502.0)
    held = FreeMemory(reserve_mb=1000.0, hold_s=0.25)
    assert held.update(0.0, sample(900.0), loaded_bytes=2_000_000) == 0.0
    assert held.update(0.25, sample(1500.0), loaded_bytes=2_000_000) == 0.0
    assert held.update(0.5, sample(1500.0), loaded_bytes=2_000_000) == pytest.approx(502.0)


def test_the_reserve_is_checked() -> None:
    with pytest.raises(UsageError, match="memory_reserve_mb"):
        ServeSettings.from_mapping({"memory_reserve_mb": -1})


def test_a_squeeze_below_the_reserve_moves_the_loop_to_the_least_memory_and_unloads_the_rest(
        tmp_path: Path) -> None:
    """Real runners; the sampler reports 3000 MB available, then 500 MB (another process took it),
    then 3000 MB again. The reserve is 2000 MB: under the squeeze no variant fits, the loop serves
    the variant of least memory and the pool keeps it alone; after it, big comes back and the pool
    is refilled."""
    variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("mid", 0.88, 1.5, 1.5),
                VariantDef("small", 0.80, 1.0, 1.0))
    bundle = load_bundle(make_bundle(tmp_path / "b", variants))
    now = [0.0]
    available = [3000.0]
    settings = ServeSettings.from_mapping({"memory_reserve_mb": 2000.0,
                                           "switch": {"min_dwell_s": 0.0, "violation_patience": 1}})
    c = Controller(bundle, settings, sampler=lambda: sample(available[0]), warmup_runs=1, clock=lambda: now[0])
    c.start(background=False)
    assert c.active_arch_id == "big" and set(c.pool.loaded_ids()) == {"big", "mid", "small"}
    available[0] = 500.0
    for _ in range(3):
        now[0] += 0.25
        record = c.tick()
    assert c.active_arch_id == "small" and record.memory_budget_mb == 0.0
    assert c.pool.loaded_ids() == ["small"]
    assert c.status()["memory_free_limit_mb"] == 0.0
    available[0] = 3000.0
    for _ in range(8):
        now[0] += 0.25
        c.tick()
        c.loads.wait_refill()  # the loads back run on a thread of their own
    assert c.active_arch_id == "big"
    # What the cut unloaded is loaded back (one per decision), so it can be measured and climbed to.
    assert set(c.pool.loaded_ids()) == {"big", "mid", "small"} and not c.loads.dropped


def test_loading_back_after_a_squeeze_does_not_hold_the_decisions(tmp_path: Path) -> None:
    """A variant's load takes 0.4 s (untuned TVM's largest took about 0.5 s with its warm-up runs).
    After the squeeze lifts, the loads back run beside the loop: every decision that does not switch
    returns in well under a load's time (a switch waits for its variant's load), and the pool is
    whole again once they are done. The code before loaded one variant per decision on the control
    thread (a 0.4 s decision each)."""
    import time

    from hmt.runtime.variant import load_variant

    variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("mid", 0.88, 1.5, 1.5),
                VariantDef("small", 0.80, 1.0, 1.0))
    bundle = load_bundle(make_bundle(tmp_path / "b", variants))
    slow = [False]

    def loader(arch_id: str):  # type: ignore[no-untyped-def]
        if slow[0]:
            time.sleep(0.4)
        return load_variant(bundle, arch_id, "onnxruntime")

    now = [0.0]
    available = [3000.0]
    settings = ServeSettings.from_mapping({"memory_reserve_mb": 2000.0,
                                           "switch": {"min_dwell_s": 0.0, "violation_patience": 1}})
    c = Controller(bundle, settings, sampler=lambda: sample(available[0]), warmup_runs=1, clock=lambda: now[0],
                   loader=loader)
    c.start(background=False)
    available[0] = 500.0
    for _ in range(3):
        now[0] += 0.25
        c.tick()
    assert c.pool.loaded_ids() == ["small"]
    slow[0], available[0] = True, 3000.0
    took = []
    for _ in range(4):
        now[0] += 0.25
        start = time.perf_counter()
        record = c.tick()
        took.append((time.perf_counter() - start, record.switched))
    assert max(t for t, switched in took if not switched) < 0.2, took
    for _ in range(6):
        c.loads.wait_refill()
        now[0] += 0.25
        c.tick()
    assert set(c.pool.loaded_ids()) == {"big", "mid", "small"} and not c.loads.dropped
    c.stop()


def test_a_scenario_squeeze_lowers_the_available_memory_the_loop_reads() -> None:
    scenario = Scenario.from_text("time_s,memory_squeeze_mb\n0,\n2,1500\n")
    assert scenario.at(3.0).memory_squeeze_mb == 1500.0 and scenario.at(0.0).memory_squeeze_mb is None
    state = ScenarioState()
    sampler = ScenarioSampler(state, synthetic_cpu=True, base=lambda: sample(4000.0))
    assert sampler().mem_available_bytes == 4000 * 1_000_000
    state.memory_squeeze_mb = 1500.0
    assert sampler().mem_available_bytes == 2500 * 1_000_000


@pytest.mark.slow
def test_the_squeeze_process_takes_and_frees_the_memory() -> None:
    """burn mode's squeeze: a real process holds the memory (in 64 MB steps), then frees it."""
    import time

    from hmt.serve.running.squeeze import MemorySqueeze

    squeeze = MemorySqueeze()
    squeeze.start()
    try:
        squeeze.set(128.0)
        deadline = time.monotonic() + 20.0
        while squeeze.held_mb < 128.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert squeeze.held_mb == 128.0
        squeeze.set(None)
        deadline = time.monotonic() + 10.0
        while squeeze.held_mb > 0.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert squeeze.held_mb == 0.0
    finally:
        squeeze.stop()


@pytest.mark.slow
def test_a_replayed_squeeze_reaches_the_loop_and_the_oracle(tmp_path: Path) -> None:
    """serve --scenario --compare in process (synthetic load mode): a squeeze of more than the headroom
    above the reserve makes the loop's memory budget 0 in that phase; the oracle there is the variant
    of least memory, and the adaptive run serves it."""
    import psutil

    from hmt.serve.running.compare import replay_compare
    from hmt.serve.running.scenario import DriveOptions
    from hmt.serve.running.session import SessionOptions

    variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("small", 0.80, 1.0, 1.0))
    bundle = make_bundle(tmp_path / "b", variants)
    reserve_mb = psutil.virtual_memory().available / 1e6 - 4000.0  # 4 GB of headroom
    scenario = Scenario.from_text("time_s,memory_squeeze_mb\n0,\n1.0,8000\n")
    options = SessionOptions(serve_overrides={"memory_reserve_mb": reserve_mb})
    comparison = replay_compare(bundle, scenario, options, DriveOptions(duration_s=2.0, clients=1, rate_hz=40.0),
                                api=None, server=None)
    quiet, squeezed = comparison.phases
    assert quiet["memory_budget_mb"] > 1000.0 and quiet["oracle_variant"] == "big"
    assert squeezed["memory_budget_mb"] == 0.0 and squeezed["oracle_variant"] == "small"
    assert squeezed["adaptive"]["variants"].get("small", 0) > squeezed["adaptive"]["variants"].get("big", 0)


def test_stopping_a_squeeze_that_never_started_is_safe() -> None:
    """A replay whose start failed before the squeeze's holder process started still stops it cleanly."""
    from hmt.serve.running.squeeze import MemorySqueeze

    squeeze = MemorySqueeze()
    squeeze.stop()  # never started: not joined, no "can only join a started process"


@pytest.mark.slow
def test_a_memory_cut_is_met_by_the_loop_and_not_by_the_static_largest(tmp_path: Path) -> None:
    """serve --scenario --compare in process: a memory budget between the two variants' footprints; the
    static largest answers from a variant over it (over budget in that phase), the adaptive run
    serves the one that fits, and the summary counts the phases each met."""
    from hmt.serve.running.compare import replay_compare
    from hmt.serve.running.scenario import DriveOptions
    from hmt.serve.running.session import SessionOptions

    variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("small", 0.80, 1.0, 1.0))
    bundle = make_bundle(tmp_path / "b", variants)
    memory_mb = {v.arch_id: float(v.memory_mb) for v in load_bundle(bundle).spec.variants}
    cut_mb = (memory_mb["big"] + memory_mb["small"]) / 2
    scenario = Scenario.from_text(f"time_s,memory_budget_mb,latency_budget_ms\n0,,1000\n1.0,{cut_mb},1000\n")
    comparison = replay_compare(bundle, scenario, SessionOptions(), DriveOptions(duration_s=2.0, clients=1,
                                                                                 rate_hz=40.0),
                                api=None, server=None)
    free, cut = comparison.phases
    assert free["memory_budget_mb"] is None and cut["memory_budget_mb"] == cut_mb
    assert free["budgets_met"] == {"adaptive": True, "oracle": True, "static_largest": True}
    assert cut["oracle_variant"] == "small" and not cut["budgets_met"]["static_largest"]
    assert cut["adaptive"]["variants"].get("small", 0) > cut["adaptive"]["variants"].get("big", 0)
    assert comparison.summary()["phases_budgets_met"]["static_largest"] == 1
