"""Burst timing: an engine whose pool falls asleep in a pause is measured at its back-to-back rate."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hmt.fuse.engines.timing import Timing, measure_alternating, timing_mode
from hmt.fuse.pipeline import BASELINE, choose


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sleepy(cold_s: float = 0.004, warm_s: float = 0.0003, idle_s: float = 0.002) -> Callable[[], None]:
    """Fast back to back; pays ``cold_s`` on the first call after ``idle_s`` without calls
    (a thread pool that fell asleep)."""
    last = [0.0]

    def run() -> None:
        now = time.perf_counter()
        _spin(cold_s if now - last[0] > idle_s else warm_s)
        last[0] = time.perf_counter()

    return run


def steady(seconds: float = 0.001) -> Callable[[], None]:
    return lambda: _spin(seconds)


def test_isolated_mode_pays_the_wake_up_and_burst_mode_does_not() -> None:
    candidates = {"sleepy": sleepy(), "steady": steady()}
    isolated = measure_alternating(candidates, warmup=1, repeats=6, burst=1)
    # Spinning sets lower bounds on wall time; a busy machine only stretches the upper ones.
    assert isolated["sleepy"].median_ms >= 4.0 and isolated["sleepy"].median_ms > 2 * isolated["steady"].median_ms
    assert isolated["sleepy"].cold_samples_ms == ()
    burst = measure_alternating(candidates, warmup=1, repeats=6, burst=4)
    assert burst["steady"].median_ms >= 1.0 and 2 * burst["sleepy"].median_ms < burst["steady"].median_ms
    # The first call of every burst is kept apart, as the cold figure.
    assert burst["sleepy"].cold_median_ms is not None and burst["sleepy"].cold_median_ms >= 4.0
    assert len(burst["sleepy"].samples_ms) == 6 and len(burst["sleepy"].cold_samples_ms) == 2  # 3 + 3 timed
    assert "cold_median_ms" in burst["sleepy"].to_json() and "cold_median_ms" not in isolated["steady"].to_json()


def test_engine_choice_follows_the_timing_mode_and_keeps_the_default_rule() -> None:
    # ORT default (the baseline) sleeps in pauses; another candidate is steady.
    candidates = {BASELINE: sleepy(), "tvm": steady()}
    isolated = measure_alternating(candidates, warmup=1, repeats=5, burst=1)
    assert choose(isolated, margin=0.05).name == "tvm"
    burst = measure_alternating(candidates, warmup=1, repeats=5, burst=5)
    assert choose(burst, margin=0.05).name == BASELINE
    # A candidate within the margin of the baseline does not replace it, in either mode.
    near = {BASELINE: Timing(BASELINE, (1.0, 1.0, 1.0)), "tvm": Timing("tvm", (0.97, 0.97, 0.97))}
    assert choose(near, margin=0.05).name == BASELINE


def test_a_candidate_that_only_wins_under_contention_is_not_chosen() -> None:
    # One ORT thread vs two on a shared 2-core machine: faster at the median (the other
    # core busy), 2x slower whenever the machine is quiet (the fast end).
    base = Timing(BASELINE, (8.0, 8.2, 16.0, 16.5, 17.0, 17.0, 17.5, 18.0, 18.0, 19.0))
    one = Timing("ort[all,threads=1](fused)", (13.5, 13.6, 13.7, 13.7, 13.8, 13.8, 13.9, 14.0, 14.0, 14.1))
    assert choose({BASELINE: base, one.name: one}, margin=0.05).name == BASELINE
    # Faster at both ends: chosen.
    chain = Timing("ort[all,threads=1](chain)", tuple(v * 0.75 for v in base.samples_ms))
    assert choose({BASELINE: base, one.name: one, chain.name: chain}, margin=0.05).name == chain.name


def test_slow_candidates_get_few_samples_and_modes_are_described() -> None:
    out = measure_alternating({"fast": steady(0.0002), "slow": steady(0.003)}, warmup=1, repeats=8, burst=3)
    assert len(out["fast"].samples_ms) == 8 and len(out["slow"].samples_ms) == 3
    assert timing_mode(8, 0.005)["mode"] == "burst" and timing_mode(1, 0.005)["mode"] == "isolated"
    with pytest.raises(ValueError):
        measure_alternating({"x": steady()}, burst=0)
