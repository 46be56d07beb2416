"""The control thread outlives a failed shadow run: decisions go on."""

from __future__ import annotations

import threading
import time

from hmt.errors import UsageError
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
