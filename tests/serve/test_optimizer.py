"""Optimizer decisions (CrowdHMTware eq. 3) on hand-made tables."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hmt.errors import InputError, UsageError
from hmt.serve import Budgets, LatencyCorrector, Optimizer, OptimizerConfig, Variant, mu_from_battery
from hmt.serve.deciding.optimizer import REASON_BEST, REASON_FASTEST, REASON_SMALLEST

MB = 1_000_000
# big: most accurate, slowest, hungriest; small: the reverse; mid in between.
TABLE = [
    Variant("big", accuracy=0.92, latency_ms=40.0, energy_mj=200.0, memory_bytes=400 * MB),
    Variant("mid", accuracy=0.88, latency_ms=20.0, energy_mj=80.0, memory_bytes=200 * MB),
    Variant("small", accuracy=0.80, latency_ms=8.0, energy_mj=20.0, memory_bytes=80 * MB),
]


def test_full_battery_no_budget_picks_most_accurate() -> None:
    d = Optimizer(TABLE).decide(load_index=0.0, battery_percent=100.0)
    assert d.arch_id == "big" and d.feasible and d.reason_code == REASON_BEST
    assert d.mu == pytest.approx(1.0)
    assert "within budgets" in d.reason


def test_low_battery_trades_accuracy_for_energy() -> None:
    opt = Optimizer(TABLE)
    # mu = 0.2 (clipped at mu_min): score = 0.2*NormA - 0.8*NormE -> small wins
    assert opt.decide(battery_percent=5.0).arch_id == "small"
    # mu = 0.6: big 0.6 - 0.4 = 0.2; mid 0.6*0.667 - 0.4*0.333 = 0.267; small 0 -> mid
    assert opt.decide(battery_percent=60.0).arch_id == "mid"
    # charging or mains power: accuracy only
    assert opt.decide(battery_percent=5.0, battery_plugged=True).arch_id == "big"
    assert opt.decide(battery_percent=None).arch_id == "big"


def test_mu_from_battery_config() -> None:
    cfg = OptimizerConfig(mu_min=0.3, mu_max=0.9, mu_no_battery=0.5, mu_when_plugged=None)
    assert mu_from_battery(10.0, None, cfg) == pytest.approx(0.3)
    assert mu_from_battery(99.0, None, cfg) == pytest.approx(0.9)
    assert mu_from_battery(55.0, True, cfg) == pytest.approx(0.55)  # plugged ignored
    assert mu_from_battery(None, None, cfg) == pytest.approx(0.5)


def test_latency_budget_under_load() -> None:
    opt = Optimizer(TABLE)
    budgets = Budgets(latency_ms=45.0)
    assert opt.decide(0.0, 100.0, budgets=budgets).arch_id == "big"
    # load 0.5: T = T0 * 1.5 -> big 60 ms > 45, mid 30 ms fits
    d = opt.decide(0.5, 100.0, budgets=budgets)
    assert d.arch_id == "mid" and d.predicted_latency_ms == pytest.approx(30.0)
    assert d.latency_scale == pytest.approx(1.5)
    # measured/predicted r = 1.6 on top: mid 48 ms > 45, small 19.2 ms
    assert opt.decide(0.5, 100.0, budgets=budgets, latency_ratio=1.6).arch_id == "small"


def test_memory_budget() -> None:
    d = Optimizer(TABLE).decide(0.0, 100.0, budgets=Budgets(memory_mb=250))
    assert d.arch_id == "mid" and d.memory_bytes == 200 * MB


def test_infeasible_returns_fastest_with_flag() -> None:
    opt = Optimizer(TABLE)
    d = opt.decide(1.0, 100.0, budgets=Budgets(latency_ms=10.0))  # small: 16 ms under full load
    assert d.arch_id == "small" and not d.feasible and d.reason_code == REASON_FASTEST
    assert "no variant meets" in d.reason
    # nothing fits the memory budget: the one of least memory
    d = opt.decide(0.0, 100.0, budgets=Budgets(latency_ms=100.0, memory_mb=10))
    assert d.arch_id == "small" and not d.feasible and d.reason_code == REASON_SMALLEST


def test_infeasible_latency_prefers_fastest_that_fits_memory() -> None:
    table = [*TABLE, Variant("tiny-fat", 0.5, 2.0, 5.0, 900 * MB)]
    d = Optimizer(table).decide(1.0, 100.0, budgets=Budgets(latency_ms=1.0, memory_mb=500))
    assert d.arch_id == "small" and not d.feasible


def test_current_variant_is_scored() -> None:
    opt = Optimizer(TABLE)
    d = opt.decide(0.5, 100.0, budgets=Budgets(latency_ms=45.0), current_arch_id="big")
    assert d.current_arch_id == "big" and d.current_feasible is False
    assert d.current_score == pytest.approx(1.0)
    d = opt.decide(0.0, 100.0, budgets=Budgets(latency_ms=45.0), current_arch_id="mid")
    assert d.current_feasible is True
    with pytest.raises(UsageError):
        opt.decide(current_arch_id="nope")


def test_cached_and_uncached_paths_agree() -> None:
    rng = np.random.default_rng(1)
    n = 60
    lat = rng.uniform(1, 50, n)
    table = [
        Variant(
            f"v{i}",
            float(rng.uniform(0.5, 0.9)),
            float(lat[i]),
            float(rng.uniform(1, 100)),
            int(rng.integers(1, 100)) * MB,
        )
        for i in range(n)
    ]
    opt = Optimizer(table)
    for _ in range(300):
        load = float(rng.uniform(0, 1))
        battery = float(rng.integers(0, 101))
        budgets = Budgets(latency_ms=float(rng.uniform(1, 60)), memory_mb=float(rng.integers(0, 100)))
        d = opt.decide(load, battery, budgets=budgets)
        # brute force
        scale = 1 + load
        mu = mu_from_battery(battery)
        acc = np.array([v.accuracy for v in table])
        en = np.array([v.energy_mj for v in table])
        na = (acc - acc.min()) / (acc.max() - acc.min())
        ne = (en - en.min()) / (en.max() - en.min())
        ok = [
            i
            for i, v in enumerate(table)
            if v.latency_ms * scale <= budgets.latency_ms and v.memory_bytes <= budgets.memory_bytes
        ]
        if ok:
            best = max(ok, key=lambda i: mu * na[i] - (1 - mu) * ne[i])
            assert d.feasible
            assert d.score == pytest.approx(mu * na[best] - (1 - mu) * ne[best])
        else:
            assert not d.feasible


def test_bad_tables_and_inputs() -> None:
    with pytest.raises(InputError):
        Optimizer([])
    with pytest.raises(InputError):
        Optimizer([TABLE[0], TABLE[0]])
    with pytest.raises(InputError):
        Optimizer([{"arch_id": "x", "accuracy": 0.5}])
    opt = Optimizer([{"arch_id": "x", "accuracy": 0.5, "latency_ms": 1, "energy_mj": 1, "memory_bytes": 1}])
    assert opt.decide().arch_id == "x"
    with pytest.raises(UsageError):
        opt.decide(load_index=1.5)
    with pytest.raises(UsageError):
        Budgets(latency_ms=-1.0)
    with pytest.raises(UsageError):
        OptimizerConfig.from_mapping({"mu_minn": 0.1})
    with pytest.raises(UsageError):
        OptimizerConfig(mu_min=0.9, mu_max=0.5)


def test_latency_corrector_smooths_and_clips() -> None:
    c = LatencyCorrector(smoothing=0.5, r_min=0.5, r_max=2.0)
    assert c.ratio == 1.0
    assert c.update(20.0, 10.0) == pytest.approx(2.0)  # first measurement taken as is
    assert c.update(10.0, 10.0) == pytest.approx(1.5)
    assert c.update(1000.0, 10.0) == pytest.approx(1.75)  # 100x outlier clipped to 2
    c.reset()
    assert c.ratio == 1.0
    with pytest.raises(UsageError):
        c.update(1.0, 0.0)


def test_decision_time_is_small() -> None:
    rng = np.random.default_rng(0)
    table = [Variant(f"v{i}", float(rng.uniform(0.5, 0.9)), float(rng.uniform(1, 50)), 1.0, MB) for i in range(1000)]
    opt = Optimizer(table)
    budgets = Budgets(latency_ms=25.0, memory_mb=1.0)
    times = []
    for load in rng.uniform(0, 1, 500):
        t0 = time.perf_counter()
        opt.decide(float(load), 70.0, None, budgets)
        times.append(time.perf_counter() - t0)
    # generous bound for a shared, loaded machine; benchmarks/serve/optimizer_decision.py reports the figures
    assert float(np.median(times)) < 1e-3


def test_the_loops_hot_path_choice_matches_the_full_decision() -> None:
    rng = np.random.default_rng(0)
    table = [Variant(f"v{i}", float(rng.uniform(0.5, 0.95)), float(rng.uniform(1, 50)), float(rng.uniform(1, 100)),
                     int(rng.integers(1, 500)) * MB) for i in range(12)]
    opt = Optimizer(table)
    for _ in range(300):
        latency = [float(x) for x in rng.uniform(0.5, 80, len(table))]
        energy = [float(x) for x in rng.uniform(1, 120, len(table))]
        budgets = Budgets(latency_ms=float(rng.uniform(1, 60)) if rng.random() < 0.8 else None,
                          memory_mb=float(rng.integers(0, 500)) if rng.random() < 0.5 else None,
                          energy=float(rng.uniform(5, 100)) if rng.random() < 0.5 else None)
        mu = round(float(rng.uniform(0.2, 1.0)), 2)
        current = table[int(rng.integers(len(table)))].arch_id
        full = opt.decide_estimates(latency, energy, mu=mu, budgets=budgets, current_arch_id=current)
        fast = opt.choose(latency, energy, mu, budgets, current)
        assert (fast.arch_id, fast.reason_code, fast.current_feasible) == (
            full.arch_id, full.reason_code, full.current_feasible)
        assert fast.score == full.score and fast.current_score == full.current_score


def test_nothing_feasible_falls_back_to_the_profiles_fastest_unless_newer_evidence_says_otherwise() -> None:
    """Optimizer.fallback: table order is the profile's (small, mid, big). A bigger variant's lower
    estimate wins only when its newest sample is at least as new as the current fallback's."""
    from hmt.serve.deciding.decision import DecisionPath

    opt = Optimizer(TABLE)
    assert [v.arch_id for v in opt.variants] == ["small", "mid", "big"]
    est = [90.0, 25.0, 120.0]  # small's p95 now, mid's floor of a few samples from earlier, big's
    inf = float("-inf")
    assert opt.fallback(est, [10.0, 9.0, 8.0], None) == 0  # mid's is older: the profile's fastest
    assert opt.fallback(est, [10.0, 10.0, 8.0], None) == 1  # as new: the estimate wins
    assert opt.fallback(est, [inf, 9.0, inf], None) == 1  # small never measured: mid's evidence wins
    assert opt.fallback([90.0, 25.0, 20.0], [inf, inf, inf], None) == 2  # priors only: the lowest estimate
    # memory keeps small out: the fastest within memory is mid, big's older estimate does not beat it
    assert opt.fallback([90.0, 60.0, 20.0], [10.0, 10.0, 5.0], 300 * MB) == 1
    assert opt.fallback(est, [10.0, 9.0, 8.0], 10 * MB) == -1  # nothing fits memory: -1 - the least memory's
    # the decision path uses it only when nothing is feasible, and recomputes it as the times move
    path = DecisionPath(opt)
    budgets = Budgets(latency_ms=5.0)
    assert path.feasible(est, [1.0] * 3, 0.0, 5.0, budgets, [10.0, 9.0, 8.0]) == (0, 0)
    assert path.feasible(est, [1.0] * 3, 0.0, 5.0, budgets, [10.0, 10.0, 8.0]) == (0, 1)
    assert path.feasible(est, [1.0] * 3, 0.0, 5.0, budgets) == (0, 1)  # no times: the lowest estimate
    assert path.feasible([4.0, 25.0, 120.0], [1.0] * 3, 0.0, 5.0, budgets, [10.0, 10.0, 8.0])[0] == 1


def test_an_infeasible_reason_states_the_request_budget_beside_its_compute_share() -> None:
    """Under load the serving overhead (queue wait) can take the whole latency budget, leaving a floor of
    1 us for compute: /v1/status's infeasible_reason said 'budget 0.001 ms' for a 3 ms budget. It now
    states the request's budget and the share of it left for compute."""
    from hmt.serve.deciding.decision import DecisionPath

    path = DecisionPath(Optimizer(TABLE))
    est = [90.0, 95.0, 120.0]
    budgets = Budgets(latency_ms=3.0)
    mask = path.feasible(est, [1.0] * 3, 0.0, 0.001, budgets, [10.0, 9.0, 8.0])
    choice = path.choose(mask, 1.0, None, None)
    decision = path.record(choice, 0.0, 0.001, 1.0, budgets)
    assert not decision.feasible and decision.budgets.latency_ms == 0.001
    assert "budget 3 ms per request, 0.001 ms of it for compute after the serving overhead" in decision.reason
    # No overhead taken: the budget as before.
    decision = path.record(choice, 0.0, 3.0, 1.0, budgets)
    assert "(budget 3.0 ms;" in decision.reason or "(budget 3.0 ms)" in decision.reason
