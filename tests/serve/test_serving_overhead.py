"""The serving overhead: the share of the latency budget queue waits take at the tail."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.errors import UsageError
from hmt.runtime.settings import ServeSettings
from hmt.serve.deciding.load import ServingOverhead


def _served(overhead: ServingOverhead, waits_ms: np.ndarray, compute_ms: np.ndarray) -> None:
    for wait, compute in zip(waits_ms, compute_ms, strict=True):
        overhead.add(float(wait), float(compute))


def test_tail_overhead_makes_the_compute_limit_the_latency_p95() -> None:
    # Waits mostly short with a spread tail (0.3 ms median, a few of 1-2 ms), compute 2.0-2.4 ms:
    # a compute p95 under budget - median wait still misses more than 5 % of a 3 ms budget.
    rng = np.random.default_rng(0)
    waits = np.where(rng.random(32) < 0.2, rng.uniform(0.8, 2.0, 32), rng.uniform(0.2, 0.4, 32))
    compute = rng.uniform(2.0, 2.4, 32)
    tail, median = ServingOverhead(mode="tail"), ServingOverhead(mode="median")
    _served(tail, waits, compute)
    _served(median, waits, compute)
    k = int(0.95 * 31 + 0.5)
    latency_p95, compute_p95 = np.sort(waits + compute)[k], np.sort(compute)[k]
    assert tail.overhead_ms() == pytest.approx(latency_p95 - compute_p95)
    assert median.overhead_ms() == pytest.approx(np.sort(waits)[16])
    limit_tail, _ = tail.latency_limit_ms(3.0, 1.0)
    limit_median, _ = median.latency_limit_ms(3.0, 1.0)
    # The tail limit holds the active variant's compute p95 to what keeps its latency p95 in budget.
    assert (compute_p95 <= limit_tail) == (latency_p95 <= 3.0 + 3.0 / 100)
    assert limit_tail < limit_median


def test_one_stall_moves_neither_reading() -> None:
    overhead = ServingOverhead(mode="tail")
    _served(overhead, np.full(31, 0.3), np.full(31, 2.0))
    overhead.add(400.0, 2.0)  # one stall of the machine
    assert overhead.overhead_ms() == pytest.approx(0.3)
    assert overhead.latency_limit_ms(3.0, 1.0)[0] == pytest.approx(2.7)


def test_few_served_requests_or_probes_fall_back_to_the_median_wait() -> None:
    overhead = ServingOverhead(mode="tail")
    for wait in (0.1, 0.5, 0.9):
        overhead.add(wait)  # probes and other variants' requests: a wait, no compute for the tail
    _served(overhead, np.full(ServingOverhead.MIN_TAIL - 1, 2.0), np.full(ServingOverhead.MIN_TAIL - 1, 1.0))
    assert overhead.overhead_ms() == pytest.approx(2.0)  # the median wait of all ten
    assert overhead.latency_limit_ms(None, 1.0)[0] == float("inf")


def test_overhead_mode_is_checked() -> None:
    assert ServeSettings.from_mapping({"correction": {"overhead": "median"}}).correction.overhead == "median"
    with pytest.raises(UsageError, match="correction.overhead"):
        ServeSettings.from_mapping({"correction": {"overhead": "p99"}})


def test_the_overhead_is_read_at_the_decisions_load_level() -> None:
    """Requests are filed under the load measured over them (at the next settle); a decision at a
    load reads that level's window, so a busy level's waits do not hold down the calm limit."""
    overhead = ServingOverhead(mode="tail", levels=5, memory_s=30.0)
    for k in range(32):
        overhead.add(0.2, 2.0, now_s=0.01 * k)  # calm
    overhead.settle(0, 0.5)
    for k in range(32):
        overhead.add(6.0, 2.5, now_s=1.0 + 0.01 * k)  # both cores busy: waits in front of every request
    overhead.settle(4, 1.5)
    assert overhead.overhead_ms(4) == pytest.approx(6.0)
    assert overhead.overhead_ms(0) == pytest.approx(0.2)  # the calm level, right after the busy phase
    assert overhead.overhead_ms() == pytest.approx(6.0)  # the last requests at any load: the busy ones
    assert overhead.latency_limit_ms(2.0, 1.0, 0)[0] == pytest.approx(1.8)
    # A level with fewer than MIN_TAIL requests falls back to the last requests at any load.
    assert overhead.overhead_ms(2) == pytest.approx(6.0)


def test_a_levels_requests_are_forgotten_after_the_memory() -> None:
    overhead = ServingOverhead(mode="tail", levels=5, memory_s=10.0)
    for k in range(16):
        overhead.add(0.2, 2.0, now_s=0.01 * k)
    overhead.settle(0, 0.2)
    for k in range(32):
        overhead.add(1.5, 2.0, now_s=1.0 + 0.01 * k)
    overhead.settle(2, 1.4)
    assert overhead.overhead_ms(0) == pytest.approx(0.2)
    overhead.settle(2, 20.0)  # 20 s later: the calm level's requests are older than the memory
    assert overhead.overhead_ms(0) == pytest.approx(1.5)  # the last requests at any load


def test_one_level_keeps_one_window() -> None:
    overhead = ServingOverhead(mode="tail")  # levels=1: overhead_by_load off
    _served(overhead, np.full(32, 0.3), np.full(32, 2.0))
    overhead.settle(0, 1.0)
    assert overhead.overhead_ms(0) == overhead.overhead_ms() == pytest.approx(0.3)
    assert ServeSettings.from_mapping({"correction": {"overhead_by_load": False}}).correction.overhead_by_load is False


def test_the_bounds_spread_with_the_waits_and_a_slow_compute_cancels_out() -> None:
    rng = np.random.default_rng(1)
    overhead = ServingOverhead(mode="tail")
    _served(overhead, rng.exponential(1.5, 64), np.full(64, 3.0))
    point, low, high = overhead.bounds_ms()
    assert low < point < high
    move, stay, reported = overhead.limits_ms(9.0, 1.0)
    assert reported == point and move < stay
    assert move == pytest.approx(9.0 - high, abs=0.09) and stay == pytest.approx(9.0 - low, abs=0.09)
    steady = ServingOverhead(mode="tail")
    _served(steady, np.full(62, 0.5), np.full(62, 2.0))
    for _ in range(2):
        steady.add(0.5, 6.0)  # slow compute times: in the latency tail and the compute tail alike
    assert steady.bounds_ms() == pytest.approx((0.5, 0.5, 0.5))


def test_the_stay_bound_judges_the_active_variant_one_order_statistic_lower() -> None:
    """64 requests of 0.4 ms waits and four of 2.5 ms (a stalled interpreter): the p95 of 64 is
    the fourth largest, so the point overhead is a spike; with ``overhead_stay_bound`` the active
    variant is judged on the lower bound (the fifth largest), another still on the point."""
    from hmt.runtime.settings import CorrectionSettings

    overhead = ServingOverhead(mode="tail")
    waits = np.full(64, 0.4)
    waits[[5, 13, 30, 51]] = 2.5
    _served(overhead, waits, np.full(64, 3.0))
    point, low, _ = overhead.bounds_ms()
    assert point == pytest.approx(2.5) and low == pytest.approx(0.4)
    move, stay, reported = overhead.decision_limits_ms(5.0, CorrectionSettings(overhead_stay_bound=True), None)
    assert (move, stay, reported) == pytest.approx((2.5, 4.6, 2.5))
    point_only = CorrectionSettings(overhead_stay_bound=False)
    assert overhead.decision_limits_ms(5.0, point_only, None) == pytest.approx((2.5, 2.5, 2.5))
    both = overhead.decision_limits_ms(5.0, CorrectionSettings(overhead_bounds=True), None)
    assert both[0] <= move and both[1] == pytest.approx(stay)


def test_a_switch_setting_that_is_not_a_boolean_is_refused() -> None:
    with pytest.raises(UsageError, match="overhead_stay_bound must be true or false, got 'yes'"):
        ServeSettings.from_mapping({"correction": {"overhead_stay_bound": "yes"}})
    with pytest.raises(UsageError, match="overhead_by_load must be true or false, got 1"):
        ServeSettings.from_mapping({"correction": {"overhead_by_load": 1}})


@pytest.mark.parametrize("budget_ms", [5e-324, 1e-310, 1e-300])
def test_a_budget_too_small_for_its_steps_is_the_floor_not_an_error(budget_ms: float) -> None:
    overhead = ServingOverhead(mode="tail")
    _served(overhead, np.full(32, 10.0), np.full(32, 1.0))
    move_ms, stay_ms, _ = overhead.limits_ms(budget_ms, 1.0)
    assert move_ms == stay_ms == 1e-3
    assert overhead.latency_limit_ms(budget_ms, 1.0)[0] == 1e-3
