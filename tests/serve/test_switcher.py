"""Hysteresis: margin, patience, dwell time, no flapping."""

from __future__ import annotations

import pytest

from hmt.errors import UsageError
from hmt.serve import Budgets, Optimizer, Switcher, SwitchPolicy, Variant

MB = 1_000_000
TABLE = [
    Variant("big", 0.92, 40.0, 200.0, 400 * MB),
    Variant("mid", 0.88, 20.0, 80.0, 200 * MB),
    Variant("small", 0.80, 8.0, 20.0, 80 * MB),
]


def step(
    opt: Optimizer,
    sw: Switcher,
    now_s: float,
    load: float = 0.0,
    battery: float = 100.0,
    latency_ms: float | None = None,
):
    d = opt.decide(load, battery, budgets=Budgets(latency_ms=latency_ms), current_arch_id=sw.active_arch_id)
    return sw.offer(d, now_s=now_s)


def test_initial_adoption_and_stay() -> None:
    opt, sw = Optimizer(TABLE), Switcher()
    r = step(opt, sw, 0.0)
    assert r.switched and r.active_arch_id == "big" and r.reason == "initial"
    r = step(opt, sw, 1.0)
    assert not r.switched and r.reason == "same_variant"
    assert sw.switch_count == 0


def test_budget_violation_switches_after_patience_even_within_dwell() -> None:
    opt, sw = Optimizer(TABLE), Switcher(SwitchPolicy(violation_patience=2, min_dwell_s=100.0))
    step(opt, sw, 0.0, latency_ms=45.0)
    r = step(opt, sw, 0.1, load=0.5, latency_ms=45.0)  # big now 60 ms
    assert not r.switched and r.reason == "violation_pending"
    r = step(opt, sw, 0.2, load=0.5, latency_ms=45.0)
    assert r.switched and r.active_arch_id == "mid" and r.reason == "budget_violation"


def test_improvement_needs_margin_patience_and_dwell() -> None:
    opt = Optimizer(TABLE)
    sw = Switcher(SwitchPolicy(score_margin=0.05, improve_patience=2, min_dwell_s=5.0))
    step(opt, sw, 0.0, battery=5.0)
    assert sw.active_arch_id == "small"
    # battery back up (plugged in would do the same): big is better by a wide margin
    assert step(opt, sw, 1.0, battery=100.0).reason == "improvement_pending"
    assert step(opt, sw, 2.0, battery=100.0).reason == "min_dwell"
    r = step(opt, sw, 6.0, battery=100.0)
    assert r.switched and r.active_arch_id == "big" and r.reason == "better_by_margin"


def test_small_gain_below_margin_stays() -> None:
    table = [Variant("a", 0.900, 10.0, 10.0, MB), Variant("b", 0.901, 10.5, 10.0, MB), Variant("c", 0.5, 1.0, 10.0, MB)]
    opt = Optimizer(table)
    sw = Switcher(SwitchPolicy(score_margin=0.05, min_dwell_s=0.0))
    sw.offer(opt.decide(0.0, 100.0, budgets=Budgets(latency_ms=10.2)), now_s=0.0)
    assert sw.active_arch_id == "a"
    for t in range(1, 10):
        r = sw.offer(opt.decide(0.0, 100.0, current_arch_id="a"), now_s=float(t))
        assert not r.switched and r.proposed_arch_id == "b" and r.reason == "below_margin"


@pytest.mark.parametrize("patience", [2, 3])
def test_no_flapping_on_alternating_inputs(patience: int) -> None:
    opt = Optimizer(TABLE)
    sw = Switcher(SwitchPolicy(violation_patience=patience, improve_patience=patience, min_dwell_s=0.0))
    step(opt, sw, 0.0, latency_ms=45.0)
    start = sw.active_arch_id
    for t in range(1, 200):
        # load, battery and budget flip every tick
        if t % 2:
            step(opt, sw, float(t), load=0.6, battery=10.0, latency_ms=45.0)
        else:
            step(opt, sw, float(t), load=0.0, battery=100.0, latency_ms=45.0)
    assert sw.switch_count == 0 and sw.active_arch_id == start


def test_revert_after_failed_load() -> None:
    opt, sw = Optimizer(TABLE), Switcher(SwitchPolicy(violation_patience=1))
    step(opt, sw, 0.0, latency_ms=45.0)
    r = step(opt, sw, 1.0, load=0.5, latency_ms=45.0)
    assert r.switched and sw.active_arch_id == "mid"
    sw.revert(r)
    assert sw.active_arch_id == "big" and sw.switch_count == 0
    with pytest.raises(UsageError):
        sw.revert(r)


def test_decision_must_score_active_variant() -> None:
    opt, sw = Optimizer(TABLE), Switcher()
    step(opt, sw, 0.0)
    with pytest.raises(UsageError):
        sw.offer(opt.decide(), now_s=1.0)
    with pytest.raises(UsageError):
        SwitchPolicy.from_mapping({"margin": 1})
