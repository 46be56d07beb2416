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


def _queued(rng: np.random.Generator, compute_ms: float, n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Requests in bursts: each waits 0.2 ms plus the compute of the 0-3 requests ahead of it."""
    compute = rng.uniform(0.95, 1.05, n) * compute_ms
    ahead = rng.choice([0, 0, 1, 2, 3], size=n)
    return 0.2 + ahead * compute_ms, compute


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scaled_overhead_reads_a_queue_the_same_on_any_variant(seed: int) -> None:
    """Bursts of arrivals: the wait is the compute of the requests ahead, so it shrinks on a faster
    variant. Read as one wait for every variant (tail), the limit read on the fast variant is far
    above the one read on the slow one (the loop climbs, the queue grows, it falls back); read in
    units of compute (scaled), the two agree, and each still holds its own variant to the budget."""
    budget = 6.0
    limits: dict[str, list[float]] = {"tail": [], "scaled": []}
    for compute_ms in (1.0, 2.0):
        rng = np.random.default_rng(seed)
        waits, compute = _queued(rng, compute_ms)
        for mode in limits:
            overhead = ServingOverhead(mode=mode)
            _served(overhead, waits, compute)
            limit, _ = overhead.latency_limit_ms(budget, 1.0)
            limits[mode].append(limit)
            k = int(0.95 * 31 + 0.5)
            latency_p95, compute_p95 = np.sort(waits + compute)[k], np.sort(compute)[k]
            # Either reading keeps the active variant exactly to its latency p95 (to the rounding steps).
            assert (compute_p95 <= limit) == (latency_p95 <= budget + budget / 100 + 0.02 * compute_p95)
    fast, slow = limits["scaled"]
    assert abs(fast - slow) / slow < 0.1
    fast, slow = limits["tail"]
    assert fast > 1.5 * slow


def test_scaled_overhead_without_a_queue_is_the_tail() -> None:
    overhead = ServingOverhead(mode="scaled")
    _served(overhead, np.full(32, 0.3), np.full(32, 2.0))
    assert overhead.split() == pytest.approx((0.3, 0.0))
    assert overhead.latency_limit_ms(3.0, 1.0)[0] == pytest.approx(2.7)
