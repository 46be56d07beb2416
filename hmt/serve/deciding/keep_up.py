"""A variant judged at the request rate it would serve: one slower than the device can keep up with queues.

The loop moves to a variant when its compute estimate fits the compute share of the latency budget:
the budget less the queue wait and serving overhead measured on the variant serving *now*
(:class:`~hmt.serve.deciding.load.ServingOverhead`). That wait is the active variant's. A variant
several times slower, at the same request rate, can need more CPU than serve has: its requests then
queue behind each other, and its wait is nothing like the fast variant's. On a TVM bundle at 40
requests/s (``benchmarks/serve/results/loop_trace_tvm_budget_step.json``) the loop climbed from a
30 ms variant (queue wait p95 0.4 ms) to a 99 ms one that fit the 145 ms compute limit; served, its
requests waited 92 ms (p95) and most missed.

So every variant but the active one is judged at its own load: at ``rate`` requests/s a variant of
compute time ``t`` keeps ``rho = rate * t / cores`` cores' worth busy. Below 1 nothing changes (the
measured wait covers a server that keeps up). At or above 1 the backlog grows until the clients wait
for it, and each request's time grows with it: the estimate becomes ``t * rho`` (for the 99 ms
variant, 40 requests/s on 2 cores: 196 ms, where its requests took 184-191 ms at p95). The active
variant keeps its measured figures: its own queue is already in the measured wait. The rate is the
requests answered over the last ``window_s`` (``RequestRate``); with no requests nothing changes.
"""

from __future__ import annotations

from collections import deque

from hmt.errors import UsageError

WINDOW_S = 1.0  # the request rate is the answers over this long


class RequestRate:
    """Requests answered per second over the last ``window_s`` (not thread-safe: call it under a lock)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        if not window_s > 0:
            raise UsageError(f"request rate window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._times: deque[float] = deque()

    def add(self, now_s: float) -> None:
        self._times.append(now_s)
        self._drop(now_s)

    def per_s(self, now_s: float) -> float:
        self._drop(now_s)
        return len(self._times) / self.window_s

    def _drop(self, now_s: float) -> None:
        times = self._times
        while times and times[0] < now_s - self.window_s:
            times.popleft()


def at_own_load(latencies_ms: list[float], rate_per_s: float, cores: float, active: int) -> list[float]:
    """``latencies_ms`` with each variant but ``active`` (its index; -1: none) that could not keep up
    with ``rate_per_s`` on ``cores`` cores inflated by its utilisation (see the module's text). The same
    list object when nothing changes (the decision caches on it)."""
    if rate_per_s <= 0 or cores <= 0:
        return latencies_ms
    full_ms = 1000.0 * cores / rate_per_s  # a variant this slow keeps every core busy
    if all(t < full_ms or i == active for i, t in enumerate(latencies_ms)):
        return latencies_ms
    return [t if i == active or t < full_ms else t * (t / full_ms) for i, t in enumerate(latencies_ms)]
