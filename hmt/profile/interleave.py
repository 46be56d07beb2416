"""Interleaved end-to-end timing of many variants, robust to machine drift.

Timing variants one after the other (each for its whole window) turns any step change of
the machine during the run (GPU clocks, a neighbour starting, thermal throttling) into a
per-variant error: every variant timed after the step reads slow. On an H100 the first 16
of 30 validation variants were within +-10% and every later one 1.5-1.8x slow. Here the
variants are timed round-robin instead:

* the variants are split into groups of at most ``group_size`` (default 10): a group's
  variants are prepared (exported, sessions or device copies made) together and released
  before the next group, which caps how many are resident at once (a big supernet's
  variants on a small device would not all fit);
* each prepared variant is warmed up once (``warmup`` runs, which also give a pilot time
  per run), then the group is timed in ``rounds`` rounds; every round visits every variant
  once, in an order shuffled per round (seeded), and a visit is one untimed re-warm run
  then a fixed number of timed runs (``ceil(repeats / rounds)``, raised so that the
  visits together fill ``min_window_s`` at the pilot speed; fixed per variant for the
  whole run, so each variant has the same number of timed runs in every round);
* a fixed *reference* variant, prepared once and resident throughout, is timed in a burst
  at the start of every round, after every ``ref_every`` variants and at the end of the
  round. Its median per round is the drift signal: ``drift_ratio`` = max / min of those
  medians (1.0 on a steady machine).

Two figures come out per variant, both reported, neither replacing the other:

* ``measurements[i]``: median/p10/p90 of all its timed runs (the raw figure, as before;
  conditions = mean background load and frequency over its group's rounds);
* ``normalised_ms[i]``: each visit's median scaled by ``level_ms / bracket``, where
  ``bracket`` is the mean of the reference bursts just before and just after the visit,
  then the median over its visits. ``level_ms`` is the caller's reference level (default:
  the median of this run's per-round reference medians), so normalised times read "as if
  the machine had stayed at the reference's typical speed".

Interleaving alone makes a drift hit every variant about equally (ranks and ratios stay
comparable); the normalisation removes what the reference saw. Neither can fix a drift
that hit the block table (measured earlier, block by block).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.profile.parsers import spread
from hmt.profile.timing import MAX_REPEATS, MIN_WINDOW_S, Conditions, Measurement, conditions_meter, utc_now

DEFAULT_ROUNDS = 5
GROUP_SIZE = 10
REF_EVERY = 5


@dataclass(frozen=True)
class InterleaveSettings:
    rounds: int = DEFAULT_ROUNDS
    group_size: int = GROUP_SIZE
    ref_every: int = REF_EVERY

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.group_size < 1 or self.ref_every < 1:
            raise ValueError(f"interleave settings must be >= 1, got {self}")


@dataclass(frozen=True)
class ReferenceRound:
    """The reference's timed runs in one round of one group."""

    group: int
    round: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    n: int
    background_util: float
    freq_mhz: float | None


@dataclass(frozen=True)
class InterleavedTiming:
    measurements: list[Measurement]
    normalised_ms: list[float]
    # Per item: the median over its visits of the reference bracket around the visit.
    reference_ms: list[float]
    reference_rounds: list[ReferenceRound]
    level_ms: float
    # Per group, per round: the order items (global indices) were visited in.
    schedule: list[list[list[int]]]
    runs_per_round: list[int]

    @property
    def drift_ratio(self) -> float:
        medians = [r.median_ms for r in self.reference_rounds]
        return max(medians) / min(medians) if medians and min(medians) > 0 else float("nan")


def interleaved_schedule(n: int, *, rounds: int, group_size: int, rng: np.random.Generator) -> list[list[list[int]]]:
    """Groups of consecutive indices (at most ``group_size``), each with ``rounds`` orders:
    a fresh permutation of the group per round, drawn from ``rng``."""
    groups = [list(range(start, min(start + group_size, n))) for start in range(0, n, group_size)]
    return [[[group[int(k)] for k in rng.permutation(len(group))] for _ in range(rounds)] for group in groups]


def reference_level(rounds: Sequence[ReferenceRound]) -> float:
    return float(statistics.median(r.median_ms for r in rounds)) if rounds else float("nan")


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def _timed(fn: Callable[[], object], count: int, clock: Callable[[], int]) -> list[float]:
    """``count`` runs of ``fn``, each timed (ms) on ``clock`` (ns)."""
    out = []
    for _ in range(count):
        start = clock()
        fn()
        out.append((clock() - start) / 1e6)
    return out


def _bracketed(events: list[tuple[int, float]]) -> list[tuple[int, float, float]]:
    """Per item visit of a round's ``events`` ((item, or -1 for the reference), visit median), in
    order: (item, its median, the mean of the reference medians just before and just after it)."""
    out = []
    for e, (i, median) in enumerate(events):
        if i < 0:
            continue
        before = next(m for j, m in reversed(events[:e]) if j < 0)
        after = next(m for j, m in events[e + 1:] if j < 0)
        out.append((i, median, (before + after) / 2))
    return out


def _measurement(samples: list[float], conditions: list[Conditions], warmup: int, when: str) -> Measurement:
    """One item's timings and the mean conditions of its visits."""
    s = spread(samples)
    return Measurement(
        s.median, s.p10, s.p90, s.iqr, s.n, warmup,
        Conditions(_mean([c.freq_mhz for c in conditions]), float(np.mean([c.background_util for c in conditions])),
                   float(sum(c.wall_s for c in conditions))), when)


def time_interleaved(
    prepare: Callable[[int], Callable[[], object]], n: int, *, reference: Callable[[], object], warmup: int,
    repeats: int, rng: np.random.Generator, settings: InterleaveSettings = InterleaveSettings(),
    level_ms: float | None = None, min_window_s: float | None = None,
    clock: Callable[[], int] = time.perf_counter_ns, progress: Callable[[int], None] | None = None,
) -> InterleavedTiming:
    """Time items ``0..n-1`` (``prepare(i)`` gives item i's zero-argument run, which must
    block until the result is ready: TorchRunner synchronises CUDA) round-robin with a
    reference between them; see the module docstring. ``progress(i)`` is called once per
    item when its group is done. ``clock`` (ns) is injectable for tests."""
    if n < 1:
        raise ValueError("nothing to time")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    window_s = MIN_WINDOW_S if min_window_s is None else min_window_s
    rounds = settings.rounds

    def timed(fn: Callable[[], object], count: int) -> list[float]:
        return _timed(fn, count, clock)

    def per_round(fn: Callable[[], object]) -> int:
        pilot = statistics.median(timed(fn, max(warmup, 2)))  # the warm-up, timed
        count = math.ceil(repeats / rounds)
        if pilot > 0:
            count = max(count, math.ceil(window_s * 1e3 / rounds / pilot))
        return max(1, min(count, MAX_REPEATS // rounds))

    ref_count = per_round(reference)
    schedule = interleaved_schedule(n, rounds=rounds, group_size=settings.group_size, rng=rng)
    samples: list[list[float]] = [[] for _ in range(n)]
    visits: list[list[tuple[float, float]]] = [[] for _ in range(n)]  # (visit median, reference bracket)
    conditions: list[list[Conditions]] = [[] for _ in range(n)]
    runs_per_round = [0] * n
    ref_rounds: list[ReferenceRound] = []
    for g, orders in enumerate(schedule):
        items = orders[0]
        fns = {i: prepare(i) for i in items}
        for i in items:
            runs_per_round[i] = per_round(fns[i])
        for r, order in enumerate(orders):
            events: list[tuple[int, float]] = []  # (item or -1 for the reference, visit median)
            ref_samples: list[float] = []
            with conditions_meter() as cond:
                for k, i in enumerate([-1, *order, -1]):
                    if i < 0 or (k > 1 and (k - 1) % settings.ref_every == 0):
                        reference()  # re-warm after the previous variant
                        burst = timed(reference, ref_count)
                        ref_samples.extend(burst)
                        events.append((-1, float(statistics.median(burst))))
                    if i < 0:
                        continue
                    fns[i]()  # re-warm: the previous visit ran another model
                    got = timed(fns[i], runs_per_round[i])
                    samples[i].extend(got)
                    events.append((i, float(statistics.median(got))))
            c = cond[0]
            for i, median, bracket in _bracketed(events):
                visits[i].append((median, bracket))
                conditions[i].append(c)
            s = spread(ref_samples)
            ref_rounds.append(ReferenceRound(g, r, s.median, s.p10, s.p90, s.n, c.background_util, c.freq_mhz))
        del fns
        if progress is not None:
            for i in items:
                progress(i)
    level = reference_level(ref_rounds) if level_ms is None else level_ms
    when = utc_now()
    measurements = [_measurement(samples[i], conditions[i], warmup, when) for i in range(n)]
    normalised = [float(statistics.median(m * level / b for m, b in v)) if all(b > 0 for _, b in v)
                  else float("nan") for v in visits]
    brackets = [float(statistics.median(b for _, b in v)) for v in visits]
    return InterleavedTiming(measurements, normalised, brackets, ref_rounds, level, schedule, runs_per_round)


def ref_rows(phase: str, result: InterleavedTiming) -> list[dict[str, Any]]:
    """The reference's per-round rows of one phase, for the profile's ``drift_reference`` table."""
    return [{"phase": phase, "group": r.group, "round": r.round, "median_ms": r.median_ms, "p10_ms": r.p10_ms,
             "p90_ms": r.p90_ms, "runs": r.n, "background_util": r.background_util,
             "freq_mhz": r.freq_mhz if r.freq_mhz is not None else float("nan")} for r in result.reference_rounds]


REFERENCE_UNITS = {"phase": "name", "group": "index", "round": "index", "median_ms": "ms", "p10_ms": "ms",
                   "p90_ms": "ms", "runs": "count", "background_util": "fraction", "freq_mhz": "MHz"}
