"""Latency measurement that alternates candidates, so background load hits all of them alike.

Two modes (``burst``):

- ``burst=1`` ("isolated"): a pause before every timed call. Each sample is a call made
  after the previous candidate went quiet: a request arriving at an idle server.
- ``burst=k>1`` ("burst", the default of fuse): a pause, then ``k`` consecutive calls of
  the same candidate; the first call of the burst absorbs the wake-up (thread pools
  asleep after the pause, caches holding the other candidate's data) and is recorded
  apart as a *cold* sample; calls 2..k are the timed samples. This is how serve runs a
  variant under load (requests back to back), and the rate the engine choice must be
  made at: a pool that falls asleep between isolated calls (ORT's on many cores) makes
  an engine look several times slower than it serves.

Candidates still alternate between bursts, so a load change hits every candidate alike.

:func:`measure_rounds` (what ``fuse`` uses) is the burst mode made robust the way
``benchmarks/supernet/headline.py`` times: each *round* visits every candidate once (the order
rotated from round to round, so no candidate always follows the same one), a visit is a
burst of ~20 back-to-back calls whose first few are dropped, and each round gives each
candidate one median. A candidate's figure is the median of its round medians, and
:func:`paired_ratios` compares two candidates round by round, so a slow spell of the
machine (another process on the shared cores) moves both sides of a ratio alike and shows
up as spread, which :func:`hmt.fuse.choice.choose` reads as the measured noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

BURST_MODE = "burst"
ROUNDS_MODE = "rounds"
SLOW_ROUNDS = 3  # rounds a candidate far slower than the fastest is timed in (one call each)
ISOLATED_MODE = "isolated"


def _median(values: tuple[float, ...]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class Timing:
    name: str
    samples_ms: tuple[float, ...]
    # First call of each burst (after the pause), not part of samples_ms; empty in isolated mode.
    cold_samples_ms: tuple[float, ...] = ()
    # measure_rounds: the median of each round's timed calls, in round order (empty otherwise).
    round_medians_ms: tuple[float, ...] = ()

    @property
    def median_ms(self) -> float:
        """The median of the round medians where rounds were timed, else of every sample."""
        return _median(self.round_medians_ms) if self.round_medians_ms else _median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def cold_median_ms(self) -> float | None:
        return _median(self.cold_samples_ms) if self.cold_samples_ms else None

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.samples_ms)
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "median_ms": round(self.median_ms, 4),
            "min_ms": round(self.min_ms, 4),
            "p10_ms": round(self.percentile_ms(0.1), 4),
            "p90_ms": round(self.percentile_ms(0.9), 4),
            "runs": len(self.samples_ms),
        }
        cold = self.cold_median_ms
        if cold is not None:
            out["cold_median_ms"] = round(cold, 4)
            out["cold_runs"] = len(self.cold_samples_ms)
        if self.round_medians_ms:
            out["round_medians_ms"] = [round(v, 4) for v in self.round_medians_ms]
        return out


def timing_mode(burst: int, settle_s: float, *, rounds: int | None = None, drop: int = 1) -> dict[str, Any]:
    """What :func:`measure_alternating` (or, with ``rounds``, :func:`measure_rounds`) measured, for reports."""
    if rounds is not None:
        return {"mode": ROUNDS_MODE, "rounds": rounds, "burst": burst, "dropped_per_burst": drop,
                "settle_s": settle_s,
                "timed": f"{rounds} rounds; each round visits every candidate once (order rotated), a visit is a "
                         f"pause then {burst} back-to-back calls of which the first {drop} are dropped; a "
                         "candidate's median_ms is the median of its round medians"}
    if burst > 1:
        return {"mode": BURST_MODE, "burst": burst, "settle_s": settle_s,
                "timed": f"calls 2..{burst} of each burst of {burst} back-to-back calls (serve's rate under load); "
                         "the first call after the pause is reported apart as cold_median_ms"}
    return {"mode": ISOLATED_MODE, "burst": 1, "settle_s": settle_s,
            "timed": "every call, each after a pause of settle_s (an idle server's first request)"}


def measure_alternating(
    candidates: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    repeats: int = 20,
    budget_s: float | None = None,
    drop_slower_than: float | None = 5.0,
    settle_s: float = 0.005,
    burst: int = 1,
) -> dict[str, Timing]:
    """Time each callable ``repeats`` times, alternating candidates, after ``warmup`` calls each.

    ``burst``: calls per visit of a candidate (see the module doc): 1 times every call after
    a pause; k > 1 pauses once, runs k calls back to back and times calls 2..k (the first
    is kept as a cold sample). ``repeats`` counts timed samples either way.
    ``drop_slower_than``: after the warm-up, a candidate slower than this many times the
    fastest one is timed only 3 times (it cannot win; untuned TVM is ~60x slower).
    ``budget_s`` caps the total measuring time (at least 3 rounds are always run).
    ``settle_s``: pause (untimed) before each visit. Runtimes' worker threads spin-wait after
    a call (TVM's pool for long enough to slow torch 100x on 2 cores); the pause lets the
    previous candidate's threads go idle so that it does not tax the next one.
    """
    if burst < 1:
        raise ValueError("burst must be >= 1")
    warm: dict[str, float] = {}
    for name, fn in candidates.items():
        time.sleep(settle_s)
        fn()  # the first call after the pause is not the warm rate
        t0 = time.perf_counter()
        for _ in range(max(1, warmup)):
            fn()
        warm[name] = (time.perf_counter() - t0) / max(1, warmup)
    fastest = min(warm.values()) if warm else 0.0
    active = dict(candidates)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    cold: dict[str, list[float]] = {name: [] for name in candidates}
    limits = {
        name: (3 if drop_slower_than and warm[name] > drop_slower_than * fastest else repeats) for name in candidates
    }
    start = time.perf_counter()
    rounds = 0
    while active:
        rounds += 1
        for name in list(active):
            fn = active[name]
            if settle_s:
                time.sleep(settle_s)
            if burst > 1:
                t0 = time.perf_counter()
                fn()
                cold[name].append((time.perf_counter() - t0) * 1e3)
            for _ in range(min(max(1, burst - 1), limits[name] - len(samples[name]))):
                t0 = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t0) * 1e3)
            if len(samples[name]) >= limits[name]:
                del active[name]
        if budget_s is not None and rounds >= 3 and time.perf_counter() - start > budget_s:
            break
    return {name: Timing(name, tuple(values), tuple(cold[name])) for name, values in samples.items() if values}


def measure_rounds(
    candidates: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 7,
    burst: int = 20,
    drop: int = 4,
    warmup: int = 3,
    settle_s: float = 0.005,
    drop_slower_than: float | None = 5.0,
    budget_s: float | None = None,
) -> dict[str, Timing]:
    """Time every candidate in ``rounds`` rounds of alternating bursts (see the module doc).

    A visit: pause ``settle_s``, then ``burst`` calls back to back; the first ``drop`` are not
    timed (the first is kept as the cold sample: thread pools waking up, caches holding the
    previous candidate's weights), calls ``drop+1..burst`` are. Round ``r`` visits the
    candidates starting at the ``r``-th one, so each leads and follows equally often.
    ``drop_slower_than``: a candidate slower than this many times the fastest after the
    warm-up is timed once in each of the first 3 rounds only (it cannot win; untuned TVM is
    ~60x slower).
    ``budget_s``: stop after the round that passes it (at least 3 rounds are run).
    """
    if burst < 2 or not 1 <= drop < burst:
        raise ValueError(f"rounds need burst >= 2 and 1 <= drop < burst, got burst={burst}, drop={drop}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    names = list(candidates)
    warm: dict[str, float] = {}
    for name in names:
        fn = candidates[name]
        time.sleep(settle_s)
        fn()
        t0 = time.perf_counter()
        for _ in range(max(1, warmup)):
            fn()
        warm[name] = (time.perf_counter() - t0) / max(1, warmup)
    fastest = min(warm.values()) if warm else 0.0
    slow = {n for n in names if drop_slower_than and warm[n] > drop_slower_than * fastest}
    samples: dict[str, list[float]] = {n: [] for n in names}
    cold: dict[str, list[float]] = {n: [] for n in names}
    medians: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)] if names else []
        for name in order:
            if name in slow and r >= SLOW_ROUNDS:
                continue
            fn = candidates[name]
            if settle_s:
                time.sleep(settle_s)
            timed: list[float] = []
            # A slow candidate: one call dropped, one timed (3 samples in all, as measure_alternating).
            calls, dropped = (2, 1) if name in slow else (burst, drop)
            for i in range(calls):
                t0 = time.perf_counter()
                fn()
                elapsed_ms = (time.perf_counter() - t0) * 1e3
                if i == 0:
                    cold[name].append(elapsed_ms)
                elif i >= dropped:
                    timed.append(elapsed_ms)
            samples[name].extend(timed)
            medians[name].append(_median(tuple(timed)))
        if budget_s is not None and r >= 2 and time.perf_counter() - start > budget_s:
            break
    return {n: Timing(n, tuple(samples[n]), tuple(cold[n]), tuple(medians[n])) for n in names if samples[n]}


def paired_ratios(candidate: Timing, reference: Timing) -> tuple[float, ...]:
    """``candidate``'s round median over ``reference``'s, round by round (rounds both ran).

    Without round data (timings from :func:`measure_alternating` or built by hand) the one
    ratio of the two medians."""
    pairs = tuple(zip(candidate.round_medians_ms, reference.round_medians_ms, strict=False))
    if not pairs:
        return (candidate.median_ms / reference.median_ms,)
    return tuple(a / b for a, b in pairs)


def ratio_noise(ratios: tuple[float, ...]) -> float:
    """Half the inter-quartile range of paired ratios: how far one round's ratio strays (0 for < 4 rounds)."""
    if len(ratios) < 4:
        return 0.0
    ordered = sorted(ratios)
    n = len(ordered) - 1
    q1 = ordered[int(0.25 * n + 0.5)]
    q3 = ordered[int(0.75 * n + 0.5)]
    return (q3 - q1) / 2
