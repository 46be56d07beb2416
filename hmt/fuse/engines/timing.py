"""Latency measurement that alternates candidates, so background load hits all of them alike."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Timing:
    name: str
    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        ordered = sorted(self.samples_ms)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    def to_json(self) -> dict[str, Any]:
        return {
            "median_ms": round(self.median_ms, 4),
            "min_ms": round(self.min_ms, 4),
            "p90_ms": round(self.percentile_ms(0.9), 4),
            "runs": len(self.samples_ms),
        }


def measure_alternating(
    candidates: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    repeats: int = 20,
    budget_s: float | None = None,
    drop_slower_than: float | None = 5.0,
    settle_s: float = 0.005,
) -> dict[str, Timing]:
    """Time each callable ``repeats`` times, round-robin, after ``warmup`` calls each.

    ``drop_slower_than``: after the warm-up, a candidate slower than this many times the
    fastest one is timed only 3 times (it cannot win; untuned TVM is ~60x slower).
    ``budget_s`` caps the total measuring time (at least 3 rounds are always run).
    ``settle_s``: pause (untimed) before each call. Runtimes' worker threads spin-wait after
    a call (TVM's pool for long enough to slow torch 100x on 2 cores); the pause lets the
    previous candidate's threads go idle so that it does not tax the next one.
    """
    warm: dict[str, float] = {}
    for name, fn in candidates.items():
        time.sleep(settle_s)
        t0 = time.perf_counter()
        for _ in range(max(1, warmup)):
            fn()
        warm[name] = (time.perf_counter() - t0) / max(1, warmup)
    fastest = min(warm.values()) if warm else 0.0
    active = dict(candidates)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    limits = {
        name: (3 if drop_slower_than and warm[name] > drop_slower_than * fastest else repeats) for name in candidates
    }
    start = time.perf_counter()
    rounds = 0
    while active:
        rounds += 1
        for name in list(active):
            if settle_s:
                time.sleep(settle_s)
            t0 = time.perf_counter()
            active[name]()
            samples[name].append((time.perf_counter() - t0) * 1e3)
            if len(samples[name]) >= limits[name]:
                del active[name]
        if budget_s is not None and rounds >= 3 and time.perf_counter() - start > budget_s:
            break
    return {name: Timing(name, tuple(values)) for name, values in samples.items() if values}
