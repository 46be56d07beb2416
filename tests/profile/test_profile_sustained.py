"""timing.sustained_ms: time per call under sustained load, where a CPU budget's stalls land on a few calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.profile.timing import (
    Burst,
    Conditions,
    Measurement,
    run_delay_ms,
    sustained_from_bursts,
    sustained_ms,
    time_callable,
)


def test_a_steady_cpu_reads_the_per_call_time() -> None:
    assert sustained_ms([0.5] * 200, burst_ms=10.0) == pytest.approx(0.5)


def test_stalls_on_a_few_calls_are_paid_in_full() -> None:
    # A 25 % budget in 1 ms slices: a 0.1 ms call runs at full speed 2.5 times in 3, the third waits 0.75 ms.
    calls = [0.1, 0.1, 0.85] * 100
    assert sorted(calls)[len(calls) // 2] == pytest.approx(0.1)  # what a per-call median sees
    assert sustained_ms(calls, burst_ms=10.0) == pytest.approx(1.05 / 3)


def test_a_burst_that_something_interrupted_is_dropped() -> None:
    calls = [1.0] * 100
    calls[5] = 500.0  # one burst of ten is hit
    assert sustained_ms(calls, burst_ms=10.0) == pytest.approx(1.0)


def test_fewer_samples_than_a_burst_give_their_mean_and_none_is_an_error() -> None:
    assert sustained_ms([1.0, 3.0], burst_ms=10.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        sustained_ms([])


def test_a_measurement_without_it_falls_back_to_the_median() -> None:
    m = Measurement(1.0, 0.9, 1.2, 0.1, 10, 1, Conditions(None, 0.0, 0.01), "now")
    assert m.sustained_or_median_ms == 1.0 and m.row()["sustained_ms"] != m.row()["sustained_ms"]  # NaN
    m2 = Measurement(1.0, 0.9, 1.2, 0.1, 10, 1, Conditions(None, 0.0, 0.01), "now", 3.5)
    assert m2.sustained_or_median_ms == 3.5 and m2.row()["sustained_ms"] == 3.5


def test_time_waiting_for_a_busy_machine_is_taken_out_and_a_frozen_class_s_stalls_stay_in() -> None:
    # Each burst: 10 calls in 20 ms. Neighbours held the CPU for 15 ms of the first: not the device's speed.
    bursts = [Burst(10, 20.0, 15.0), Burst(10, 20.0, 0.0), Burst(10, 6.0, 1.0)]
    assert sustained_from_bursts(bursts) == pytest.approx(0.5)
    # A paced class is frozen (not runnable) for its stalls: no waiting recorded, the stalls count.
    assert sustained_from_bursts([Burst(10, 40.0, 0.0)] * 3) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        sustained_from_bursts([])


def test_run_delay_is_read_from_schedstat_and_zero_where_there_is_none(tmp_path: Path) -> None:
    stat = tmp_path / "schedstat"
    stat.write_text("231492 1700809 2\n")
    assert run_delay_ms(str(stat)) == pytest.approx(1.700809)
    assert run_delay_ms(str(tmp_path / "missing")) == 0.0


def test_time_callable_reports_a_sustained_time_next_to_the_median() -> None:
    m = time_callable(lambda: sum(range(2000)), warmup=2, repeats=20, min_window_s=0.05)
    assert m.sustained_ms is not None and 0.5 * m.median_ms < m.sustained_ms < 5 * m.median_ms
