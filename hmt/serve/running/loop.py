"""The control thread: a decision every period, sooner on demand, shadow runs in between.

A decision runs every ``period_s``, and on demand (a request over its latency budget, a
budget change, a pending budget violation) at most every ``min_gap_s``; requests for one in
between merge into one. Between decisions the thread runs ``idle_work`` (shadow runs of idle
variants) while it says it did something and there is time, never instead of a decision.

Nothing a tick or a shadow run raises ends the thread: an error that is not an ``HmtError`` (a
bug, or a runtime library's own exception) is counted and kept as ``last_unexpected_error`` for
``/v1/status``, and the decisions go on. A dead control thread would leave the last variant
serving through every later budget, memory cut and load step.
"""

from __future__ import annotations

import math
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from hmt.errors import DeviceError, HmtError

TRIGGER_INITIAL = "initial"
TRIGGER_PERIODIC = "periodic"
TRIGGER_ON_DEMAND = "on_demand"


class ControlThread:
    """Runs ``tick(trigger)`` on its own thread (see the module docstring); ``idle_wanted`` says
    whether ``idle_work`` has work, so the thread wakes often enough to do it."""

    def __init__(self, tick: Callable[[str], object], idle_work: Callable[[], bool],
                 idle_wanted: Callable[[], bool], *, period_s: float, min_gap_s: float,
                 clock: Callable[[], float]) -> None:
        self._tick = tick
        self._idle_work = idle_work
        self._idle_wanted = idle_wanted
        self.period_s = period_s
        self.min_gap_s = min_gap_s
        self._clock = clock
        self.last_tick_s = -math.inf  # on ``clock``, set by the tick itself (any thread)
        self.pending = False  # an on-demand decision was asked for
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unexpected_errors = 0  # exceptions other than HmtError from a tick or a shadow run
        self.last_unexpected_error: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def alive(self) -> bool:
        """The thread is started and has not ended."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def seconds_since_tick(self) -> float | None:
        """How long ago the last decision began (None before the first): a few periods at most while
        the loop is alive and not stuck."""
        return None if math.isinf(self.last_tick_s) else max(0.0, self._clock() - self.last_tick_s)

    def _guarded(self, call: Callable[..., object], *args: object) -> object:
        """``call(*args)``; an HmtError is the call's own to record (None), any other exception is counted."""
        try:
            return call(*args)
        except HmtError:
            return None
        except Exception as exc:  # noqa: BLE001 - the loop must outlive a bug in one decision
            frames = traceback.extract_tb(exc.__traceback__)
            where = f" (in {frames[-1].name}, {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
            self.last_unexpected_error = f"{type(exc).__name__}: {exc}{where}"
            self.unexpected_errors += 1  # after the message: a reader that sees the count sees its message
            return None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="hmt-serve-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (:meth:`join` waits for it)."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout_s: float) -> None:
        """Wait for the thread after :meth:`stop` (DeviceError if it does not end in ``timeout_s``)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise DeviceError(f"serve control thread did not stop within {timeout_s} s")

    def request(self) -> bool:
        """Ask for a decision soon: now, or ``min_gap_s`` after the last one. Requests in between
        merge into one. False when the thread is not running."""
        if self._thread is None:
            return False
        self.pending = True
        self._wake.set()
        return True

    def _loop(self) -> None:
        period_s = self.period_s
        min_gap_s = self.min_gap_s
        next_s = self._clock() + period_s
        while not self._stop.is_set():
            now = self._clock()
            wait_s = next_s - now
            if self.pending:
                wait_s = min(wait_s, self.last_tick_s + min_gap_s - now)
            # Idle variants are measured between decisions (bounded share), never instead of one; a
            # failed shadow run must not end the loop (the decisions go on without it).
            idle_ran = bool(self._guarded(self._idle_work)) if wait_s > 0.02 else False
            if idle_ran:
                continue
            self._wake.wait(max(0.0, min(wait_s, 0.1) if self._idle_wanted() else wait_s))
            self._wake.clear()
            if self._stop.is_set():
                return
            now = self._clock()
            if self.pending and now - self.last_tick_s >= min_gap_s:
                self.pending = False
                trigger = TRIGGER_ON_DEMAND
            elif now >= next_s:
                trigger = TRIGGER_PERIODIC
                next_s = max(next_s + period_s, now)  # fell behind: do not burst
            else:
                continue
            self._guarded(self._tick, trigger)  # an HmtError: the tick records it
