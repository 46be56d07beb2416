"""Whose time a remote request spent: the device's own core, or the link and the peer (no torch).

A round trip measured on the device (``elapsed``) holds three kinds of time:

- the device's own: the calling thread on its core (building, sending and parsing the
  HTTP exchange) or waiting for its core (another process ahead of it, or a CPU quota
  that throttled it). Linux counts both per thread in ``/proc/thread-self/schedstat``
  (time on the CPU, time runnable but waiting; a CFS-throttled thread waits there too);
- the peer's: its ``server_ms`` (decode, queue, compute), reported in its answer;
- the rest: the link (both directions, the proxy in between) and the peer's HTTP stack.

Charging the device's part to the link made a busy device believe its link had become
slow, so it stayed local exactly when offloading paid most (the shipped bundle's run,
benchmarks/offload/results/shipped_bundle.json). :func:`thread_times_ms` reads the counters; :class:`RecentTail` keeps a
recent high percentile of a quantity (the budget is a tail target, so the planner plans
each part at its tail).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_SCHEDSTAT = "/proc/thread-self/schedstat"
_schedstat_ok = True


@dataclass(frozen=True)
class ThreadTimes:
    cpu_ms: float
    wait_ms: float | None  # None: this system does not count run-queue waits


def thread_times_ms() -> ThreadTimes:
    """CPU time and run-queue wait of the calling thread so far (ms); the wait is None off Linux."""
    global _schedstat_ok
    if _schedstat_ok:
        try:
            with open(_SCHEDSTAT, "rb") as handle:
                fields = handle.read().split()
            return ThreadTimes(int(fields[0]) / 1e6, int(fields[1]) / 1e6)
        except (OSError, ValueError, IndexError):
            _schedstat_ok = False
    return ThreadTimes(time.thread_time() * 1e3, None)


@dataclass(frozen=True)
class DeviceShare:
    """The device's own part of an exchange: CPU time and the wait for its core (None: unknown)."""

    cpu_ms: float
    wait_ms: float | None

    @classmethod
    def between(cls, before: ThreadTimes, after: ThreadTimes) -> DeviceShare:
        wait = None if before.wait_ms is None or after.wait_ms is None else max(0.0, after.wait_ms - before.wait_ms)
        return cls(max(0.0, after.cpu_ms - before.cpu_ms), wait)

    def wall_ms(self, device_ratio: float) -> float:
        """Wall time the device itself spent: CPU + wait where counted, else CPU x its slowdown."""
        return self.cpu_ms + self.wait_ms if self.wait_ms is not None else self.cpu_ms * max(1.0, device_ratio)


NO_SHARE = DeviceShare(0.0, None)  # a reply built without measuring (tests, fakes)


class RecentTail:
    """The ``quantile`` of the samples of the last ``window_s`` (thread-safe); ``default`` below
    ``min_samples`` of them."""

    def __init__(self, clock: Callable[[], float], *, window_s: float, quantile: float = 0.9,
                 min_samples: int = 3, maxlen: int = 256) -> None:
        self.clock = clock
        self.window_s = window_s
        self.quantile = quantile
        self.min_samples = min_samples
        self._samples: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._version = 0  # bumped by add(): a cached quantile is stale once a sample arrives
        # (version, time, default) -> the quantile: every decision asks, and np.percentile over
        # up to maxlen samples cost ~0.07 ms a decision; samples leave the window slowly, so a
        # value at most CACHE_S old is as good as a fresh one.
        self._cached: tuple[int, float, float, float] | None = None

    CACHE_S = 0.05

    def add(self, value: float) -> None:
        with self._lock:
            self._samples.append((self.clock(), value))
            self._version += 1

    def recent(self) -> list[float]:
        since = self.clock() - self.window_s
        with self._lock:
            return [v for t, v in self._samples if t >= since]

    def value(self, default: float) -> float:
        now = self.clock()
        cached = self._cached
        if (cached is not None and cached[0] == self._version and 0.0 <= now - cached[1] < self.CACHE_S
                and cached[2] == default):
            return cached[3]
        values = self.recent()
        result = default if len(values) < self.min_samples else float(np.percentile(values, 100 * self.quantile))
        self._cached = (self._version, now, default, result)
        return result
