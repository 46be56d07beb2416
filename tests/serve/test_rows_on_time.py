"""A scenario's rows take effect at their times, however late the replaying process's driver thread is:
the load processes follow the rows' times on their own, and the control thread applies a row that is due."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from serve_bundles import CLASSES

from hmt.errors import UsageError
from hmt.serve.running import session
from hmt.serve.running.burn import LoadGenerator, SharedPlan
from hmt.serve.running.scenario import DriveOptions, RowApplier, Scenario
from hmt.serve.running.session import SessionOptions, run_scenario


def test_a_shared_plan_is_a_step_function_of_the_shared_clock() -> None:
    plan = SharedPlan(multiprocessing.get_context("spawn"), capacity=3)
    assert plan.at(5.0) is None  # no plan yet: the parent's values hold
    plan.set(10.0, [0.0, 2.0, 3.0], [0.5, None, 1.0])
    assert [plan.at(t) for t in (9.9, 10.0, 11.9, 12.0, 13.5)] == [0.0, 0.5, 0.5, 0.0, 1.0]
    plan.set(10.0, [2.0, 3.0], [0.5, 1.0])  # a first row after 0 s holds from the start, as Scenario.at says
    assert [plan.at(t) for t in (9.9, 10.0, 11.5, 13.0)] == [0.0, 0.5, 0.5, 1.0]
    with pytest.raises(UsageError, match="room for 3"):
        plan.set(0.0, [0.0, 1.0, 2.0, 3.0], [0.0] * 4)
    with pytest.raises(UsageError, match="ascending"):
        plan.set(0.0, [1.0, 0.5], [0.0, 0.0])
    with pytest.raises(UsageError, match="2 times for 1 values"):
        plan.set(0.0, [0.0, 1.0], [0.0])
    with pytest.raises(UsageError, match="plan_rows"):
        LoadGenerator(cores=1.0).follow(0.0, [0.0], [1.0])


def test_the_row_applier_applies_each_row_once_in_order_from_either_caller() -> None:
    scenario = Scenario.from_text("time_s,cpu_load\n0,\n1,0.5\n2,1\n3,\n")
    rows = list(scenario.rows)
    applied: list[float] = []
    now = [0.0]
    applier = RowApplier(rows, lambda row: applied.append(row.time_s), clock=lambda: now[0])
    applier.due(50.0)
    assert applied == []  # not started: nothing is due
    applier.start(100.0)
    applier.due(101.5)  # the control thread, first: rows 0 and 1 are due
    assert applied == [0.0, 1.0] and applier.applied_on_sample == 2
    applier.through(rows[0])  # the driver, late: already applied, nothing again
    now[0] = 102.25
    applier.through(rows[2])  # the driver, a quarter second after row 2's time
    assert applied == [0.0, 1.0, 2.0] and applier.driver_late_max_s == pytest.approx(0.25)
    applier.due(102.9)
    assert applied == [0.0, 1.0, 2.0] and applier.applied == 3
    applier.due(103.0)
    assert applied == [0.0, 1.0, 2.0, 3.0] and applier.applied_on_sample == 3


def test_the_burners_follow_their_plan_without_the_parent() -> None:
    """Busy from the plan's start, idle from its second row, with no call of set() in between."""
    gen = LoadGenerator(cores=1.0, plan_rows=2)
    gen.start()
    try:
        proc = psutil.Process(gen._procs[0].pid)
        start = time.monotonic()
        gen.follow(start, [0.0, 0.8], [1.0, None])

        def busy_s(t0: float, t1: float) -> float:
            time.sleep(max(0.0, start + t0 - time.monotonic()))
            before = sum(proc.cpu_times()[:2])
            time.sleep(max(0.0, start + t1 - time.monotonic()))
            return sum(proc.cpu_times()[:2]) - before

        assert busy_s(0.1, 0.7) > 0.3  # of 0.6 s flat out (the machine's other work takes some)
        assert busy_s(1.0, 1.6) < 0.1
    finally:
        gen.stop()


def test_a_late_driver_does_not_delay_the_rows(bundle_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver thread applies each row after its time plus 0.8 s (a thread that waits for the
    interpreter on a starved device): the budget of the row at 0.6 s still reaches the loop within a
    tick of 0.6 s, because the control thread applies a row that is due."""
    real_drive = session.drive

    def late_drive(scenario: Scenario, options: DriveOptions, apply_row: Any, *args: Any, **kwargs: Any) -> Any:
        calls: list[object] = []

        def late(row: Any) -> None:
            if calls:
                time.sleep(0.8)
            calls.append(row)
            apply_row(row)

        return real_drive(scenario, options, late, *args, **kwargs)

    monkeypatch.setattr(session, "drive", late_drive)
    scenario = Scenario.from_text("time_s,latency_budget_ms\n0,5\n0.6,1.5\n")
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    y = rng.integers(0, CLASSES, 16)
    np.savez(data, x=(np.eye(CLASSES, dtype=np.float32)[y] * 8.0), y=y)
    result = run_scenario(bundle_dir, scenario, SessionOptions(), DriveOptions(duration_s=1.6, clients=1, rate_hz=20.0),
                          api=None, server=None, data=data, rng=rng)
    first = next(t.time_s for t in result.ticks if t.latency_budget_ms == 1.5)
    assert result.summary["rows_applied_on_sample"] >= 1 and result.summary["driver_late_max_s"] >= 0.7
    assert 0.55 <= first < 0.6 + 0.4, first  # without the control thread's part: 1.4 s
