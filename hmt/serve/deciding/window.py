"""One variant's recent compute times at one load level, for :mod:`hmt.serve.deciding.estimates`.

Kept in arrival order (to age them out) and sorted (bisect on insert, <= 64 floats), so the
window's tail and median are index lookups when a decision reads them.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque


def tail_bound_ranks(n: int, quantile: float) -> tuple[int, int]:
    """The ranks (0-based, in ``n`` sorted samples) one standard error below and above the
    ``quantile``'s: the count of samples under the true quantile is binomial, ``n q`` +-
    ``sqrt(n q (1 - q))``, so these bound what a window of ``n`` cannot tell apart from it."""
    k = quantile * n
    spread = math.sqrt(n * quantile * (1.0 - quantile))
    low = min(n - 1, max(0, math.ceil(k - spread) - 1))
    high = min(n - 1, max(0, math.ceil(k + spread) - 1))
    return low, high


class SampleWindow:
    """Recent compute times of one variant: in arrival order (to age them out) and sorted (so
    the tail and the median are index lookups)."""

    __slots__ = ("load_sum", "loads", "ordered", "size", "times", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.times: deque[float] = deque()
        self.values: deque[float] = deque()
        self.loads: deque[float] = deque()  # the load index each sample saw (the level's mean load)
        self.load_sum = 0.0
        self.ordered: list[float] = []

    def add(self, now_s: float, value: float, load: float = 0.0, max_age_s: float = math.inf,
            keep: int = 1) -> None:
        """Add a sample; samples more than ``max_age_s`` older than it leave (ageing within the
        level), but a regime of ``keep`` samples or more leaves only once ``keep`` samples younger
        than that replace it: one shadow run at a level the loop comes back to must not turn the
        window it kept into a single sample. (A few samples from brief earlier visits age as
        before: they do not add up to a tail.)"""
        self.times.append(now_s)
        self.values.append(value)
        self.loads.append(load)
        self.load_sum += load
        insort(self.ordered, value)
        times = self.times
        cutoff_s = now_s - max_age_s
        if times[0] < cutoff_s:
            young = len(times) - bisect_left(times, cutoff_s)
            if young < keep <= len(times) - young:
                cutoff_s = -math.inf  # the level's new regime is not established yet: keep the old one
        while len(times) > self.size or times[0] < cutoff_s:
            self._drop_oldest()

    def pop_since(self, since_s: float) -> list[tuple[float, float]]:
        """Remove the samples taken at or after ``since_s`` (the newest ones); returns (time, value)
        oldest first."""
        times = self.times
        out: list[tuple[float, float]] = []
        while times and times[-1] >= since_s:
            t = times.pop()
            value = self.values.pop()
            self.load_sum -= self.loads.pop()
            del self.ordered[bisect_left(self.ordered, value)]
            out.append((t, value))
        if not self.loads:
            self.load_sum = 0.0
        out.reverse()
        return out

    def mean_load(self) -> float:
        n = len(self.loads)
        return self.load_sum / n if n else 0.0

    def _drop_oldest(self) -> None:
        self.times.popleft()
        self.load_sum -= self.loads.popleft()
        if not self.loads:
            self.load_sum = 0.0  # no drift from the running sum
        ordered = self.ordered
        del ordered[bisect_left(ordered, self.values.popleft())]

    def expire(self, cutoff_s: float) -> None:
        """Drop the samples taken before ``cutoff_s`` (older than the memory)."""
        times = self.times
        while times and times[0] < cutoff_s:
            self._drop_oldest()

    def fresh(self, now_s: float, max_age_s: float) -> int:
        """Samples younger than ``max_age_s`` (times are appended in order: bisect them)."""
        times = self.times
        if not times:
            return 0
        return len(times) - bisect_left(times, now_s - max_age_s)

    def recent_floor(self, max_age_s: float) -> float | None:
        """The lower median (the smaller of two) of the samples within ``max_age_s`` of the newest,
        when there are two or more: a floor under the window's tail that one outlier cannot raise,
        nor two taken far apart (the samples a level keeps from an earlier visit do not count)."""
        times = self.times
        n = len(times) - bisect_left(times, times[-1] - max_age_s) if times else 0
        if n < 2:
            return None
        recent = sorted(self.values[k] for k in range(len(times) - n, len(times)))
        return recent[(n - 1) // 2]

    def tail_bounds(self, quantile: float) -> tuple[float, float]:
        """The order statistics one standard error below and above the ``quantile``'s (the count
        of samples under the true quantile is binomial: ``n q`` +- ``sqrt(n q (1 - q))``): the
        tail a window of this size cannot tell apart from its p95 (see :mod:`hmt.serve.deciding.estimates`)."""
        ordered = self.ordered
        low, high = tail_bound_ranks(len(ordered), quantile)
        return ordered[low], ordered[high]

    def quantiles(self, quantile: float) -> tuple[float, float]:
        """(tail, median) of the samples in the window."""
        ordered = self.ordered
        n = len(ordered)
        k = min(n - 1, max(0, math.ceil(quantile * n) - 1))
        return ordered[k], ordered[n // 2]
