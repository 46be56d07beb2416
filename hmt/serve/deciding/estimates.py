"""Per-variant latency estimates: measured first, the profile's prediction only as a prior.

Each variant keeps a window of its recent compute times per *load level* (the outside load
index when the sample was taken, in ``load_buckets`` buckets), from served requests and from
shadow runs (:meth:`LatencyEstimator.observe`). Within a level, a sample ages out when it is
``max_age_s`` older than the level's newest one (the machine moved on at that level), and every
sample is forgotten ``memory_s`` after it was taken. So, under load, a variant not run recently
is judged on what it measured at a similar load, not on a prior from an unloaded period (which
made the loop climb to a bigger variant every dwell and fall back 0.3 s later). Its estimate for
a decision at load ``I`` is:

- **measured**: the p95 of its window at ``I``'s level once that holds ``min_samples`` samples
  (feasibility is judged on the tail, not the mean). Which p95: a window of ``n`` samples knows
  its p95 only to about one order statistic either side (the count of samples under the true
  p95 is binomial, ``0.95 n +- sqrt(0.95 * 0.05 n)``), so the *active* variant is judged on the
  lower of them and every other variant on the upper: the loop leaves a variant once its window
  says, beyond that error, that the variant misses more than 5% of deadlines, and moves to one
  only when its window says, within it, that it does not. Judged on the point p95 both ways,
  a variant whose true miss share is near 5% crossed the line every few windows on sampling
  noise alone, and the loop oscillated in steady phases (issue 28: 6-12 switches in an 18 s
  replay on ONNX Runtime, below a largest variant that met the budget);
- **scaled** otherwise, if another level holds ``min_samples``: the nearest such level's p95,
  scaled by the load model from that level's mean load to ``I``
  (``(1 + alpha * I) / (1 + alpha * I_level)``);
- **prior** otherwise: the profile's latency, scaled by the load model
  (``1 + alpha * I``), by ``r`` (measured / predicted: the engine's current average times
  the variant's own ratio to its engine when it was last measured, so priors follow the
  engine's state now; 1 before anything ran on the engine), and by the tail factor
  (p95 / median over the measured windows), so a prediction is a p95 as well.

In the last two cases, a level holding 2 to ``min_samples - 1`` samples taken within ``max_age_s``
of each other (right after a load step) puts a floor under the estimate: their lower median
(**measured_few** when it is the higher), so two slow requests in a row at a new load outweigh a
load model that says the variant still fits. In every case the lower median of a variant's
newest ``LAST_SAMPLES`` (3) samples, whatever their level, while they are within ``max_age_s`` of
now, is a floor as well (**measured_few**): two of its last three requests this slow.

Last, a scaled or prior estimate is held between what this load measured on the variants the
profile ranks beside it (:mod:`hmt.serve.deciding.bounds`): at most the p95 of a slower variant, and
at least the estimate of a faster one; where the two disagree, the higher wins.

Samples are filed under the load of the tick before them and moved, at the next tick, to the
level of the load that tick measured over their interval (:meth:`LatencyEstimator.refile`);
within a level, old samples make way for new ones only once ``min_samples`` new ones are there.

No silent clamp: ``r`` is not clipped. When a variant's measured ``r`` leaves
``[r_min, r_max]`` (the prediction and the measurements disagree beyond the bound) the
measurement still wins, and :meth:`LatencyEstimator.disagreements` says so, for status
and metrics.

The decision path is cheap because the work is done when a measurement arrives, not per
decision: ``observe`` inserts the sample into its window's sorted list (bisect, <= 64 floats),
so a window's p95 and median are index lookups; ``refresh`` only drops samples that aged out
and re-reads the windows that changed, and bumps :attr:`LatencyEstimator.version` only when
an estimate the decision uses changed (a measured tail, the set of measured variants, or a
prior's ``r`` by more than :data:`PRIOR_R_STEP`). ``latencies`` is cached per
(version, load scale, level), so a decision whose inputs did not change reuses everything.
Memory is bounded: at most ``load_buckets x window`` samples per variant.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from hmt.compat import strict_zip
from hmt.runtime.settings import MODE_MEASURED, EstimatorSettings
from hmt.serve.deciding.bounds import (
    SOURCE_FEW,
    SOURCE_MEASURED,
    SOURCE_PRIOR,
    SOURCE_SCALED,
    bound_by_faster,
    cap_by_slower,
)
from hmt.serve.deciding.window import SampleWindow

# A prior's r is published again only when it moved by more than this (relative) from the value
# published, so that the EMA moving by a fraction of a percent with every request does not
# change the estimates (and recompute the feasible set) every tick.
PRIOR_R_STEP = 0.01
MAX_TAIL_FACTOR = 2.0  # p95 / median a prior may assume (see refresh)
LEVEL_LOAD_STEP = 0.02  # a level's mean load is published in these steps (as the loop's load bucket)
LAST_SAMPLES = 3  # a variant's newest samples, whatever their level: 2 of them over the budget floor its estimate


@dataclass(frozen=True)
class Estimate:
    arch_id: str
    latency_ms: float  # the tail latency the decision uses
    source: str  # measured (at this load level), scaled (from another level) or prior
    samples: int  # fresh samples in the window
    ratio: float | None  # measured / predicted of this variant (None: never measured)
    disagrees: bool  # ratio outside [r_min, r_max]: the measurement overrides the prediction


class LatencyEstimator:
    """Estimates for a fixed table of variants (see the module docstring)."""

    def __init__(self, arch_ids: Sequence[str], predicted_ms: Sequence[float], engines: Sequence[str],
                 settings: EstimatorSettings | None = None, *, smoothing: float = 0.3, r_min: float = 0.2,
                 r_max: float = 5.0, alpha_latency: float = 0.0) -> None:
        self.settings = settings if settings is not None else EstimatorSettings()
        self.smoothing = smoothing
        self.r_min = r_min
        self.r_max = r_max
        self.alpha_latency = alpha_latency  # the load model, to scale a level's tail to another level
        self.measure = self.settings.mode == MODE_MEASURED
        self.arch_ids = list(arch_ids)
        self.predicted_ms = list(predicted_ms)
        self.engines = list(engines)
        self._index = {a: i for i, a in enumerate(self.arch_ids)}
        n_levels = self.settings.load_buckets
        self._windows = [[SampleWindow(self.settings.window) for _ in range(n_levels)] for _ in self.arch_ids]
        self._r_variant: list[float | None] = [None] * len(self.arch_ids)
        self._r_engine: dict[str, float] = {}
        self._rel: list[float | None] = [None] * len(self.arch_ids)
        self._prior_r = [1.0] * len(self.arch_ids)  # r of each prior, as of the last refresh (in steps)
        self._r_changed = False
        self.tail_factor = self.settings.default_tail
        self.samples = 0
        # Per variant and level, as of the last refresh: the tail, the median, the mean load (in
        # LEVEL_LOAD_STEP steps, so that a sample moving the mean by a hair does not bump the version).
        self._tails: list[list[float | None]] = [[None] * n_levels for _ in self.arch_ids]
        # The tails one order statistic-error below / above (the active variant's / the others'; see
        # the module docstring).
        self._tails_low: list[list[float | None]] = [[None] * n_levels for _ in self.arch_ids]
        self._tails_high: list[list[float | None]] = [[None] * n_levels for _ in self.arch_ids]
        self._active = -1  # the active variant's index, as last given to latencies
        self._medians: list[list[float | None]] = [[None] * n_levels for _ in self.arch_ids]
        # A level with 2..min_samples-1 samples: their lower median, a floor under whatever the
        # estimate is scaled or prior from (the measurements at this load win over the load model).
        self._floors: list[list[float | None]] = [[None] * n_levels for _ in self.arch_ids]
        self._level_loads: list[list[float]] = [[0.0] * n_levels for _ in self.arch_ids]
        self.measured_count = 0  # variants measured at some level
        self._level = 0  # the level of the last decision's load (stale() and estimates() read it)
        self._now_level = 0  # the level of the load measured at the last decision (see latencies)
        # (variant, level) windows that changed since the last refresh, and the earliest time any
        # sample leaves by the memory: refresh touches only those, not every window (the levels
        # multiply the windows by load_buckets).
        self._dirty: set[tuple[int, int]] = set()
        self._next_expiry_s = math.inf
        # Each variant's newest samples (time, ms), whatever their load level, and their lower
        # median as of the last refresh while they are within max_age_s of it (see latencies).
        kept = LAST_SAMPLES if self.settings.floor_span_s <= 0 else self.settings.window
        self._last: list[deque[tuple[float, float]]] = [deque(maxlen=kept) for _ in self.arch_ids]
        self._last_floor: list[float] = [0.0] * len(self.arch_ids)
        # Each variant's newest sample time, whatever its level (-inf: never measured): the
        # nothing-feasible fallback trusts a bigger variant's lower estimate only when it is as new.
        self.newest_s: list[float] = [-math.inf] * len(self.arch_ids)
        # Windows that got samples since the last refile, and when that was (see refile).
        self._recent: set[tuple[int, int]] = set()
        self._refiled_s = -math.inf
        # Bumped whenever an estimate the decision reads changed (see the module docstring).
        self.version = 0
        self._latency_key: tuple[int, float, int, int, int] | None = None
        self._latency_value: tuple[list[float], list[float]] = ([], [])
        self._sources: list[str] = [SOURCE_PRIOR] * len(self.arch_ids)
        # Fastest first by the profile, ties in table order (see bounds.py).
        self._by_predicted = sorted(range(len(self.arch_ids)), key=lambda i: (self.predicted_ms[i], i))

    def level_of(self, load: float) -> int:
        """The load level (bucket) of an outside load index; levels are centred on 0, 1/(n-1), ..., 1."""
        n = self.settings.load_buckets
        if n == 1 or not math.isfinite(load):
            return 0
        return min(n - 1, max(0, int(load * (n - 1) + 0.5)))

    def set_engine(self, arch_id: str, engine: str) -> None:
        """The engine a variant really runs on (known once loaded); its r falls back to that engine's."""
        i = self._index[arch_id]
        if self.engines[i] != engine:
            self.engines[i] = engine
            self._r_changed = True

    def observe(self, arch_id: str, measured_ms: float, predicted_ms: float, now_s: float,
                load: float = 0.0) -> None:
        """One measured compute time of ``arch_id`` at outside load index ``load``, against the
        prediction for that run (load-scaled, no r)."""
        i = self._index.get(arch_id)
        if i is None or not (math.isfinite(measured_ms) and measured_ms >= 0):
            return
        level = self.level_of(load)
        self._windows[i][level].add(now_s, measured_ms, load, self.settings.max_age_s, self.settings.min_samples)
        self._dirty.add((i, level))
        self._recent.add((i, level))
        self._last[i].append((now_s, measured_ms))
        if now_s > self.newest_s[i]:
            self.newest_s[i] = now_s
        expiry_s = now_s + self.settings.memory_s
        if expiry_s < self._next_expiry_s:
            self._next_expiry_s = expiry_s
        self.samples += 1
        if predicted_ms > 0 and math.isfinite(predicted_ms):
            sample = measured_ms / predicted_ms
            a = self.smoothing
            r = self._r_variant[i]
            self._r_variant[i] = sample if r is None else r + a * (sample - r)
            engine = self.engines[i]
            r_e = self._r_engine.get(engine)
            # How this variant runs against its prediction *relative to its engine now*: when
            # the load lifts, the active variant's r falls and every prior of that engine with it.
            rel = sample / r_e if r_e is not None and r_e > 0 else 1.0
            q = self._rel[i]
            self._rel[i] = rel if q is None else q + a * (rel - q)
            self._r_engine[engine] = sample if r_e is None else r_e + a * (sample - r_e)
            self._r_changed = True

    def refile(self, load: float, now_s: float) -> int:
        """File the samples taken since the last refile under ``load``'s level.

        A sample is filed under the load index of the tick before it, but the load a tick measures
        is the CPU use *since the tick before* (psutil's ``cpu_percent(interval=None)``): the
        samples between two ticks ran under the later tick's load. Right after a load step they
        were filed under the old, idle level, and two slow samples among an idle window's 30 set
        its p95 over the budget: the variant looked too slow at idle for ``memory_s`` and the loop
        did not climb back when the load lifted. The loop calls this at each tick, with the load
        it just measured. Returns how many samples moved."""
        level = self.level_of(load)
        since_s, self._refiled_s = self._refiled_s, now_s
        recent, self._recent = self._recent, set()
        moved = 0
        for i, old in recent:
            if old == level:
                continue
            samples = self._windows[i][old].pop_since(since_s)
            if not samples:
                continue
            window = self._windows[i][level]
            for t, value in samples:
                window.add(t, value, load, self.settings.max_age_s, self.settings.min_samples)
            self._dirty.add((i, old))
            self._dirty.add((i, level))
            moved += len(samples)
        return moved

    def ratio(self, arch_id: str) -> float | None:
        return self._r_variant[self._index[arch_id]]

    def engine_ratio(self, engine: str) -> float | None:
        return self._r_engine.get(engine)

    def prior_ratio(self, arch_id: str) -> float:
        """The r a prior of ``arch_id`` is scaled by, as of the last :meth:`refresh` (within
        :data:`PRIOR_R_STEP` of the current one)."""
        return self._prior_r[self._index[arch_id]]

    def refresh(self, now_s: float) -> int:
        """Summarise the windows at ``now_s``: forget samples older than ``memory_s``, re-read the
        windows that changed, update the priors' r; bump :attr:`version` if anything the decision
        reads changed. Returns how many variants are measured (at some load level).

        Separate from :meth:`latencies` so the decision itself stays a few list operations
        (the loop times both: ``estimate_us`` and ``decision_us``).
        """
        if not self.measure:
            return 0
        if now_s >= self._next_expiry_s:
            self._expire(now_s - self.settings.memory_s)
        changed = self._summarise_dirty()
        changed = self._refresh_last_floors(now_s - self.settings.max_age_s) or changed
        if changed:
            self._refresh_tail_factor()
        if self._r_changed:
            changed = self._refresh_prior_r() or changed
        if changed:
            self.version += 1
        return self.measured_count

    def _expire(self, cutoff_s: float) -> None:
        """Drop the samples past the memory, and find when the next one will be."""
        memory_s = self.settings.memory_s
        next_s = math.inf
        for i, windows in enumerate(self._windows):
            for level, window in enumerate(windows):
                times = window.times
                if times and times[0] < cutoff_s:
                    window.expire(cutoff_s)
                    self._dirty.add((i, level))
                if times:
                    next_s = min(next_s, times[0] + memory_s)
        self._next_expiry_s = next_s

    def _summarise_dirty(self) -> bool:
        """Re-read the (variant, level) windows that changed: tail and median, or the floor of a few."""
        s = self.settings
        changed = False
        for i, level in self._dirty:
            window = self._windows[i][level]
            times = window.times
            tails = self._tails[i]
            tail: float | None = None
            median: float | None = None
            floor: float | None = None
            low: float | None = None
            high: float | None = None
            if len(times) >= s.min_samples:
                tail, median = window.quantiles(s.quantile)
                low, high = window.tail_bounds(s.quantile)
            elif len(times) >= 2:
                floor = window.recent_floor(s.max_age_s)
            self._medians[i][level] = median
            if floor != self._floors[i][level]:
                self._floors[i][level] = floor
                changed = True
            if low != self._tails_low[i][level] or high != self._tails_high[i][level]:
                self._tails_low[i][level], self._tails_high[i][level] = low, high
                changed = True
            mean_load = round(window.mean_load() / LEVEL_LOAD_STEP) * LEVEL_LOAD_STEP
            if tail != tails[level] or (tail is not None and mean_load != self._level_loads[i][level]):
                tails[level] = tail
                self._level_loads[i][level] = mean_load
                changed = True
        self._dirty.clear()
        return changed

    def _refresh_last_floors(self, oldest_s: float) -> bool:
        """The floor from each variant's newest samples, whatever their level."""
        last_floor = self._last_floor
        span_s = self.settings.floor_span_s
        changed = False
        for i, last in enumerate(self._last):
            floor_ms = 0.0
            if span_s > 0:
                if len(last) >= 2 and last[-1][0] >= oldest_s:
                    since_s = last[-1][0] - span_s
                    recent = sorted(v for t, v in last if t >= since_s)
                    if len(recent) >= 2:
                        floor_ms = recent[(len(recent) - 1) // 2]
            elif len(last) >= 2 and last[0][0] >= oldest_s:
                floor_ms = sorted(v for _, v in last)[(len(last) - 1) // 2]
            if floor_ms != last_floor[i]:
                last_floor[i] = floor_ms
                changed = True
        return changed

    def _refresh_tail_factor(self) -> None:
        self.measured_count = sum(any(t is not None for t in tails) for tails in self._tails)
        # The priors are tail latencies too, with the spread measured now.
        spreads = [t / m for tails, medians in strict_zip(self._tails, self._medians)
                   for t, m in strict_zip(tails, medians)
                   if t is not None and m is not None and m > 0]
        if spreads:
            # Capped: right after a load step a window holds both regimes, and its p95/median
            # (10 when the step is 10x) is the step, not the spread; r already follows the
            # step, so an uncapped factor would price every prior at step x step.
            self.tail_factor = min(MAX_TAIL_FACTOR, max(1.0, sum(spreads) / len(spreads)))

    def _refresh_prior_r(self) -> bool:
        """The priors' r per variant (its engine's r times its relative factor), published when it
        moved by more than the step from what was published."""
        self._r_changed = False
        low, high = 1.0 - PRIOR_R_STEP, 1.0 + PRIOR_R_STEP
        prior_r = self._prior_r
        r_engines = self._r_engine
        changed = False
        for i, rel in enumerate(self._rel):
            r_engine = r_engines.get(self.engines[i])
            if r_engine is None:
                r = self._r_variant[i] or 1.0
            else:
                r = r_engine * (1.0 if rel is None else rel)
            if not low <= r / prior_r[i] <= high:
                prior_r[i] = r
                changed = True
        return changed

    def latencies(self, load_scale: float, load: float | None = None,
                  load_now: float | None = None, active: str | None = None) -> tuple[list[float], list[float]]:
        """Per variant (as of the last :meth:`refresh`), at outside load index ``load`` (None: the
        last one given): the tail latency to decide on, and its ratio to the load-scaled prediction
        (energy is scaled by it). ``load_scale`` is the load model's ``1 + alpha * load``.

        ``load_now`` (None: the last one given): the load measured now, when ``load`` is a
        forecast that lags it. Where its level is busier than ``load``'s, a variant's estimate is
        at least what it measured there (its p95, or the floor of a few samples): the forecast
        smooths a step over several ticks, the requests at the new load show it at once. A rise
        of the load index alone changes nothing; slow samples at that load do.

        ``active`` (None: the last one given): the variant serving now, whose measured tail is the
        lower bound of its window's p95; every other variant's is the upper (see the module docstring).

        Cached per (version, load scale, levels, active): the lists are shared, do not modify them."""
        level = self._level if load is None else self.level_of(load)
        self._level = level
        if load_now is not None:
            self._now_level = self.level_of(load_now)
        if active is not None:
            self._active = self._index.get(active, -1)
        now_level = self._now_level
        active_i = self._active
        key = (self.version, load_scale, level, now_level, active_i)
        if key == self._latency_key:
            return self._latency_value
        predicted = self.predicted_ms
        if not self.measure:
            value = [t * load_scale for t in predicted], [1.0] * len(predicted)
        else:
            out = []
            ratios = []
            sources = self._sources
            tail_factor = self.tail_factor
            prior_r = self._prior_r
            floors = self._floors
            last_floor = self._last_floor
            for i in range(len(self.arch_ids)):
                # The active variant on the low side of its p95, the others on the high side.
                tails = self._tails_low[i] if i == active_i else self._tails_high[i]
                prior_ms = predicted[i] * load_scale
                tail = tails[level]
                source = SOURCE_MEASURED
                floor = floors[i][level]
                if tail is None:
                    tail = self._nearest_level_tail(tails, i, level, load_scale)
                    source = SOURCE_SCALED
                if tail is None:
                    r = prior_r[i]
                    tail = prior_ms * r * tail_factor
                    source = SOURCE_PRIOR
                if floor is not None and floor > tail:
                    # Too few samples at this load for a p95, but enough to say the model is low.
                    tail = floor
                    source = SOURCE_FEW
                if now_level > level:
                    seen = tails[now_level]
                    seen_source = SOURCE_MEASURED
                    if seen is None:
                        seen, seen_source = floors[i][now_level], SOURCE_FEW
                    if seen is not None and seen > tail:
                        tail, source = seen, seen_source
                if last_floor[i] > tail:
                    # Its newest requests, whatever load level they were filed under (the load
                    # index of a 2-core machine jumps between levels from tick to tick right
                    # after a step, so no level holds two of them): 2 of the last 3 this slow.
                    tail, source = last_floor[i], SOURCE_FEW
                out.append(tail)
                ratios.append(tail / prior_ms if source != SOURCE_PRIOR else prior_r[i])
                sources[i] = source
            by_predicted = self._by_predicted
            cap_by_slower(out, ratios, sources, predicted, by_predicted, load_scale)
            # second: where the two disagree, the higher wins
            bound_by_faster(out, ratios, sources, predicted, by_predicted, load_scale)
            value = out, ratios
        self._latency_key, self._latency_value = key, value
        return value

    def _nearest_level_tail(self, tails: Sequence[float | None], i: int, level: int,
                            load_scale: float) -> float | None:
        """Variant ``i``'s tail at the nearest load level measured, scaled to ``load_scale``; on a
        tie the busier level (the cautious side). None when no level is measured."""
        n_levels = self.settings.load_buckets
        for d in range(1, n_levels):
            for other in (level + d, level - d):
                if 0 <= other < n_levels:
                    t = tails[other]
                    if t is not None:
                        return t * load_scale / (1.0 + self.alpha_latency * self._level_loads[i][other])
        return None

    def estimates(self, now_s: float, load_scale: float, load: float | None = None) -> list[Estimate]:
        """Every variant's estimate with its source (for status and metrics)."""
        s = self.settings
        self.refresh(now_s)
        latencies, _ = self.latencies(load_scale, load)
        level = self._level
        result = []
        for i, arch_id in enumerate(self.arch_ids):
            n = self._windows[i][level].fresh(now_s, s.max_age_s)
            r = self._r_variant[i]
            source = self._sources[i] if self.measure else SOURCE_PRIOR
            result.append(Estimate(arch_id, latencies[i], source, n, r,
                                   r is not None and not self.r_min <= r <= self.r_max))
        return result

    def disagreements(self) -> dict[str, float]:
        """Variants whose measured/predicted ratio is outside [r_min, r_max]: the measurement wins."""
        return {a: r for a, r in strict_zip(self.arch_ids, self._r_variant)
                if r is not None and not self.r_min <= r <= self.r_max}

    def latest(self, arch_id: str) -> float | None:
        """``arch_id``'s estimate as of the last :meth:`latencies` (None before the first)."""
        values = self._latency_value[0]
        return values[self._index[arch_id]] if values else None

    def measured_since(self, arch_id: str, since_s: float) -> bool:
        """Whether ``arch_id`` has a sample taken at or after ``since_s`` (any load level)."""
        last = self._last[self._index[arch_id]]
        return bool(last) and last[-1][0] >= since_s

    def newest_sample_s(self, arch_id: str) -> float:
        """When ``arch_id``'s newest sample was taken (any load level; -inf before the first)."""
        return self.newest_s[self._index[arch_id]]

    def stale(self, arch_id: str, now_s: float) -> bool:
        """Whether ``arch_id`` lacks ``min_samples`` fresh samples at the current load level (a
        shadow run would help)."""
        window = self._windows[self._index[arch_id]][self._level]
        return window.fresh(now_s, self.settings.max_age_s) < self.settings.min_samples
