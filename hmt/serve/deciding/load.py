"""What a decision reads besides the estimates: the load outside serve and the serving overhead.

- :class:`OutsideLoad`: the load index of the load *outside* serve (AdaScale eq. 2 on a
  sample with serve's own CPU time taken out) and its AR forecast for the next period.
- :class:`ServingOverhead`: each request's queue wait; their median is the share of the
  latency budget no variant can use, so the estimates (compute alone) get what it leaves.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from hmt.runtime.settings import LoadWeights
from hmt.serve.deciding.load_index import LoadForecaster, load_index_of
from hmt.serve.deciding.monitor import ResourceSample

QUEUE_WINDOW = 32  # requests whose queue wait sets the serving overhead (median)
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


class ServingOverhead:
    """Queue wait per request. The median of the last ``window`` requests, not a mean: one stall
    of the machine (hundreds of ms) must not make every variant infeasible and send the loop
    switching on noise no choice can fix."""

    def __init__(self, window: int = QUEUE_WINDOW) -> None:
        self.waits_ms: deque[float] = deque(maxlen=window)

    def add(self, queued_ms: float) -> None:
        self.waits_ms.append(max(0.0, queued_ms))

    def latency_limit_ms(self, budget_ms: float | None, headroom: float) -> tuple[float, float]:
        """(compute share of the latency budget, serving overhead): the budget covers queue wait +
        compute; the estimates are compute alone, so they get what the serving overhead measured
        now leaves of it (times the headroom). Infinite without a latency budget."""
        waits = sorted(self.waits_ms)
        overhead_ms = waits[len(waits) // 2] if waits else 0.0
        if budget_ms is None:
            return math.inf, overhead_ms
        step = budget_ms / OVERHEAD_STEPS
        overhead_q = math.ceil(overhead_ms / step - 1e-9) * step
        return max(1e-3, headroom * budget_ms - overhead_q), overhead_ms
