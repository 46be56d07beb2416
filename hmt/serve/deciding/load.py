"""What a decision reads besides the estimates: the load outside serve and the serving overhead.

- :class:`OutsideLoad`: the load index of the load *outside* serve (AdaScale eq. 2 on a
  sample with serve's own CPU time taken out) and its AR forecast for the next period.
- :class:`ServingOverhead`: the share of the latency budget no variant can use (the tail that
  queue waits add to served latency), so the estimates (compute alone) get what it leaves.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from hmt.runtime.settings import CorrectionSettings, LoadWeights
from hmt.serve.deciding.load_index import LoadForecaster, load_index_of
from hmt.serve.deciding.monitor import ResourceSample
from hmt.serve.deciding.window import tail_bound_ranks

# Requests whose queue waits set the serving overhead (per load level): 64, so that its upper
# bound (limits_ms) is the second largest, not the largest, and one stall does not move it.
QUEUE_WINDOW = 64
# The decision sees the serving overhead in steps of 1% of the latency budget (rounded up:
# never more budget than measured), so its inputs change only when they change enough to matter.
OVERHEAD_STEPS = 100


class OutsideLoad:
    """The outside load index, updated once per tick from a resource sample."""

    def __init__(self, weights: LoadWeights, *, order: int = 2, window: int = 60, recent: int = 5) -> None:
        self.weights = weights
        self.forecaster = LoadForecaster(order=order, window=window)
        self._recent: deque[float] = deque(maxlen=recent)
        self.now = 0.0  # the load index of the last update (shadow runs wait for idle)

    def update(self, sample: ResourceSample) -> tuple[float, float, float | None]:
        """(load index now, forecast for the next period, serve's own CPU share)."""
        own = sample.own_cpu_util  # measured by the live sampler; a synthetic sample is outside load already
        outside = sample if own is None else replace(sample, cpu_util=max(0.0, sample.cpu_util - own))
        load_now = self.now = load_index_of(outside, self.weights)
        self.forecaster.update(load_now)
        recent = self._recent
        recent.append(load_now)
        # An AR fit over a step-like window can overshoot wildly (we saw 1.0 and 0.0 forecast
        # right after a step from 0.02 to 0.27): keep its smoothing, not its extrapolation.
        load_next = min(max(recent), max(min(recent), float(self.forecaster.forecast(1)[0])))
        return load_now, load_next, own

    @property
    def recent_max(self) -> float:
        """The highest load index of the last few updates: the device counts as idle for optional work
        (shadow runs of variants that are not the active one's neighbours) only when all were low."""
        return max(self._recent) if self._recent else self.now


class ServingOverhead:
    """The share of the latency budget no variant can use, from the requests served lately.

    ``tail`` (default): p95 of (queue wait + compute) less p95 of compute over the last ``window``
    requests the active variant answered, so the active variant's compute p95 fits the limit
    exactly when its served latency p95 fits the budget, which is what a deadline miss share is
    judged on. A compute p95 plus the *median* wait (``median``, what serve read before) under-states
    that tail whenever waits spread: on the demo bundle at a 3 ms budget the median wait was
    0.3 ms while p95 latency less p95 compute was 0.6-0.8 ms, and the loop kept a variant that
    missed 5-10 % of deadlines. Order statistics, not means: one stall of the machine (hundreds of
    ms) in a window moves neither p95 (the window's third largest) nor the median, so it cannot
    make every variant infeasible and send the loop switching on noise no choice can fix.
    Until ``MIN_TAIL`` requests have a compute time, the median wait stands in.

    **Per load level** (``levels`` > 1), like the estimates: the overhead is a matter of the load as
    much as compute is (two busy cores put milliseconds of wait in front of a sub-ms variant), so
    the served requests are filed by the outside load they ran under (at the next tick, under the
    load that tick measured over them: :meth:`settle`), and a decision at a load reads that level's
    window while it holds ``MIN_TAIL`` requests of the last ``memory_s``, else the last ``window``
    served at any load. With one window for every load, the waits of a busy phase stayed in it
    for ``window`` requests after the load lifted (0.8 s at 40 requests/s): the compute limit left
    no variant feasible and the loop climbed back 0.5-1 s late (issue 28's matrix)."""

    MIN_TAIL = 8

    def __init__(self, window: int = QUEUE_WINDOW, mode: str = "tail", *, levels: int = 1,
                 memory_s: float = math.inf) -> None:
        self.mode = mode
        self.memory_s = memory_s
        self.waits_ms: deque[float] = deque(maxlen=window)
        self._served: deque[tuple[float, float]] = deque(maxlen=window)  # (latency, compute) in ms
        # Per level: (time, latency, compute) of the requests settled there; and those not settled yet.
        self._levels: list[deque[tuple[float, float, float]]] = [deque(maxlen=window) for _ in range(levels)]
        self._pending: list[tuple[float, float, float]] = []
        self._now_s = 0.0

    def add(self, queued_ms: float, compute_ms: float | None = None, now_s: float = 0.0) -> None:
        """One request's queue wait; ``compute_ms`` when the active variant answered it."""
        wait = max(0.0, queued_ms)
        self.waits_ms.append(wait)
        if compute_ms is not None:
            self._served.append((wait + compute_ms, compute_ms))
            if len(self._levels) > 1:
                self._pending.append((now_s, wait + compute_ms, compute_ms))

    def settle(self, level: int, now_s: float) -> None:
        """File the requests served since the last call under ``level`` (the load measured over them)."""
        self._now_s = now_s
        if self._pending and 0 <= level < len(self._levels):
            self._levels[level].extend(self._pending)
        self._pending = []

    def clear(self) -> None:
        self.waits_ms.clear()
        self._served.clear()
        for window in self._levels:
            window.clear()
        self._pending = []

    def _served_at(self, level: int | None) -> list[tuple[float, float]]:
        served: list[tuple[float, float]] = []
        if self.mode == "tail" and level is not None and 0 <= level < len(self._levels) and len(self._levels) > 1:
            since_s = self._now_s - self.memory_s
            served = [(lat, comp) for t, lat, comp in list(self._levels[level]) if t >= since_s]
        return served if len(served) >= self.MIN_TAIL else list(self._served)

    def bounds_ms(self, level: int | None = None) -> tuple[float, float, float]:
        """(overhead, lower bound, upper bound) at load ``level`` (None: over the last requests at
        any load). The bounds take the latency tail one order statistic below and above its p95
        (the binomial error :meth:`~hmt.serve.deciding.window.SampleWindow.tail_bounds` gives the
        estimates): what a window of this size cannot tell apart from the overhead."""
        served = self._served_at(level)
        n = len(served)
        if self.mode == "tail" and n >= self.MIN_TAIL:
            latencies = sorted(s[0] for s in served)
            compute = sorted(s[1] for s in served)
            k = int(0.95 * (n - 1) + 0.5)
            low, high = tail_bound_ranks(n, 0.95)
            # The same order statistic of both: a slow compute time is in both and cancels out.
            point, lower, upper = (max(0.0, latencies[i] - compute[i]) for i in (k, low, high))
            return point, min(point, lower), max(point, upper)
        waits = sorted(self.waits_ms)
        median = waits[len(waits) // 2] if waits else 0.0
        return median, median, median

    def overhead_ms(self, level: int | None = None) -> float:
        """The overhead at load ``level`` (None: over the last requests at any load)."""
        return self.bounds_ms(level)[0]

    def latency_limit_ms(self, budget_ms: float | None, headroom: float,
                         level: int | None = None) -> tuple[float, float]:
        """(compute share of the latency budget, serving overhead): the budget covers queue wait +
        compute; the estimates are compute alone, so they get what the serving overhead measured
        at load ``level`` leaves of it (times the headroom). Infinite without a latency budget."""
        overhead_ms = self.overhead_ms(level)
        return self._limit(budget_ms, headroom, overhead_ms), overhead_ms

    def limits_ms(self, budget_ms: float | None, headroom: float,
                  level: int | None = None) -> tuple[float, float, float]:
        """(compute limit for a variant to move to, for the active one to stay on, overhead): the
        first leaves the overhead's upper bound, the second its lower bound, so like the
        estimates' tails (:mod:`hmt.serve.deciding.estimates`) the loop leaves a variant once the
        requests say, beyond a window's error, that it misses, and moves to one only when they
        say, within it, that it does not. Judged on the point p95, a variant whose misses sat
        near 5 % under bursty arrivals (Poisson waits) crossed the line on sampling noise alone
        and the loop switched back and forth in steady phases (issue 28's matrix)."""
        point, low, high = self.bounds_ms(level)
        return self._limit(budget_ms, headroom, high), self._limit(budget_ms, headroom, low), point

    def decision_limits_ms(self, budget_ms: float | None, correction: CorrectionSettings,
                           level: int | None) -> tuple[float, float, float]:
        """:meth:`limits_ms` with ``correction.overhead_bounds``; with ``correction.overhead_stay_bound``
        the point overhead to move and its lower bound to stay; else the point overhead for both."""
        if correction.overhead_bounds:
            return self.limits_ms(budget_ms, correction.headroom, level)
        point, low, _ = self.bounds_ms(level)
        move_ms = self._limit(budget_ms, correction.headroom, point)
        stay_ms = self._limit(budget_ms, correction.headroom, low) if correction.overhead_stay_bound else move_ms
        return move_ms, stay_ms, point

    @staticmethod
    def _limit(budget_ms: float | None, headroom: float, overhead_ms: float) -> float:
        if budget_ms is None:
            return math.inf
        step = budget_ms / OVERHEAD_STEPS
        # A budget so small its step is 0 or the overhead a count of steps past floats (a scenario's
        # latency_budget_ms of 5e-324 or 1e-310) fits nothing: the floor, not a ZeroDivisionError or
        # OverflowError raised in every decision while it holds.
        steps = overhead_ms / step - 1e-9 if step > 0 else math.inf
        if not math.isfinite(steps):
            return 1e-3
        return max(1e-3, headroom * budget_ms - math.ceil(steps) * step)
