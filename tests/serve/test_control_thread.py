"""The control thread outlives a failed shadow run and a decision that raises a bug: decisions go on."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from serve_bundles import make_bundle

from hmt.bundle import load_bundle
from hmt.errors import UsageError
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.deciding.monitor import ResourceSample
from hmt.serve.reporting.metrics import controller_metrics_text
from hmt.serve.running.loop import ControlThread


def test_a_failing_idle_work_does_not_end_the_decisions() -> None:
    ticks: list[str] = []
    failures = 0
    ticked = threading.Event()

    def tick(trigger: str) -> None:
        ticks.append(trigger)
        if len(ticks) >= 3:
            ticked.set()

    def idle_work() -> bool:
        nonlocal failures
        failures += 1
        raise UsageError("unknown variant 'x'")  # what a stale table made the shadow runs raise

    loop = ControlThread(tick, idle_work, lambda: True, period_s=0.05, min_gap_s=0.0, clock=time.monotonic)
    loop.start()
    try:
        assert ticked.wait(5.0), (ticks, failures)
        assert loop._thread is not None and loop._thread.is_alive() and failures >= 1
    finally:
        loop.stop()
        loop.join(5.0)


def test_a_tick_that_raises_a_bug_does_not_end_the_decisions() -> None:
    """A tick that raises something other than an HmtError (a bug in one decision, a runtime's own
    exception) once killed the thread: the last variant then served through every later budget,
    memory cut and load step. The thread counts it, keeps the message and goes on deciding."""
    ticks: list[str] = []
    ticked = threading.Event()

    def tick(trigger: str) -> None:
        ticks.append(trigger)
        if len(ticks) == 2:
            raise ZeroDivisionError("float division by zero")
        if len(ticks) >= 5:
            ticked.set()

    loop = ControlThread(tick, lambda: False, lambda: False, period_s=0.02, min_gap_s=0.0, clock=time.monotonic)
    loop.start()
    try:
        assert ticked.wait(5.0), ticks
        assert loop.alive
        assert loop.unexpected_errors == 1
        # what and where: the innermost frame, by file name only
        assert loop.last_unexpected_error is not None
        assert loop.last_unexpected_error.startswith("ZeroDivisionError: float division by zero (in tick, ")
        assert "test_control_thread.py:" in loop.last_unexpected_error and "/" not in loop.last_unexpected_error
    finally:
        loop.stop()
        loop.join(5.0)
    assert not loop.alive


def test_the_status_shows_a_loop_that_outlived_a_bug_and_it_still_follows_a_memory_cut(tmp_path: Path) -> None:
    """A real controller on its own thread: one decision raises a bug; the status says so, and the
    next memory cut still moves the loop off the variant it no longer fits."""
    bundle = load_bundle(make_bundle(tmp_path / "b"))
    settings = ServeSettings.from_mapping({"estimates": {"mode": "predicted"}, "monitor_period_s": 0.02,
                                           "switch": {"min_dwell_s": 0.0, "violation_patience": 1}})
    c = Controller(bundle, settings, sampler=lambda: ResourceSample(time.monotonic(), 0.0, 8_000_000_000,
                                                                    8_000_000_000))
    real = c.decision.feasible
    calls = 0

    def feasible_with_a_bug(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyError("a stale table's variant")
        return real(*args, **kwargs)

    c.decision.feasible = feasible_with_a_bug  # type: ignore[method-assign]
    c.start()
    try:
        deadline = time.monotonic() + 10.0
        while c.loop.unexpected_errors == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        loop = c.status()["control_loop"]
        assert loop["alive"] and loop["unexpected_errors"] == 1 and "KeyError" in loop["last_unexpected_error"]
        assert loop["seconds_since_decision"] is not None and loop["seconds_since_decision"] < 5.0
        assert c.active_arch_id == "big"
        metrics = controller_metrics_text(c)
        assert "hmt_control_loop_alive 1.0" in metrics and "hmt_control_loop_unexpected_errors_total 1.0" in metrics
        c.set_budgets(latency_ms=None, memory_mb=2.5)  # big no longer fits
        while c.active_arch_id == "big" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.active_arch_id == "mid"
    finally:
        c.stop()
