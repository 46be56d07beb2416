"""Per-variant latency estimates: measured first, the profile's prediction only as a prior.

Each variant keeps a window of its recent compute times, from served requests and from
shadow runs (:meth:`LatencyEstimator.observe`). Its estimate for a decision is:

- **measured**: the window's p95 once it holds ``min_samples`` samples younger than
  ``max_age_s`` (feasibility is judged on the tail, not the mean);
- **prior** otherwise: the profile's latency, scaled by the load model
  (``1 + alpha * I``), by ``r`` (measured / predicted: the engine's current average times
  the variant's own ratio to its engine when it was last measured, so priors follow the
  engine's state now; 1 before anything ran on the engine), and by the tail factor
  (p95 / median over the measured windows), so a prediction is a p95 as well.

No silent clamp: ``r`` is not clipped. When a variant's measured ``r`` leaves
``[r_min, r_max]`` (the prediction and the measurements disagree beyond the bound) the
measurement still wins, and :meth:`LatencyEstimator.disagreements` says so, for status
and metrics.

The hot path is cheap: ``observe`` appends to a deque and updates two averages;
``estimates`` recomputes a window's p95 only when it changed (a sort of <= 64 floats).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from hmt.runtime.settings import MODE_MEASURED, EstimatorSettings

SOURCE_MEASURED = "measured"
SOURCE_PRIOR = "prior"


@dataclass(frozen=True)
class Estimate:
    arch_id: str
    latency_ms: float  # the tail latency the decision uses
    source: str  # measured or prior
    samples: int  # fresh samples in the window
    ratio: float | None  # measured / predicted of this variant (None: never measured)
    disagrees: bool  # ratio outside [r_min, r_max]: the measurement overrides the prediction


class _Window:
    __slots__ = ("cached_n", "dirty", "median_ms", "tail_ms", "times", "values")

    def __init__(self, size: int) -> None:
        self.times: deque[float] = deque(maxlen=size)
        self.values: deque[float] = deque(maxlen=size)
        self.dirty = False
        self.tail_ms = 0.0
        self.median_ms = 0.0
        self.cached_n = 0

    def fresh(self, now_s: float, max_age_s: float) -> int:
        """Samples younger than ``max_age_s`` (times are appended in order: bisect them)."""
        times = self.times
        if not times:
            return 0
        return len(times) - bisect_left(times, now_s - max_age_s)

    def quantiles(self, n: int, quantile: float) -> tuple[float, float]:
        """(tail, median) of the newest ``n`` values, cached until an append or ``n`` changes."""
        if self.dirty or n != self.cached_n:
            values = list(self.values)
            values = sorted(values[len(values) - n:])
            k = min(len(values) - 1, max(0, math.ceil(quantile * len(values)) - 1))
            self.tail_ms = values[k]
            self.median_ms = values[len(values) // 2]
            self.dirty = False
            self.cached_n = n
        return self.tail_ms, self.median_ms


class LatencyEstimator:
    """Estimates for a fixed table of variants (see the module docstring)."""

    def __init__(self, arch_ids: Sequence[str], predicted_ms: Sequence[float], engines: Sequence[str],
                 settings: EstimatorSettings | None = None, *, smoothing: float = 0.3, r_min: float = 0.2,
                 r_max: float = 5.0) -> None:
        self.settings = settings if settings is not None else EstimatorSettings()
        self.smoothing = smoothing
        self.r_min = r_min
        self.r_max = r_max
        self.measure = self.settings.mode == MODE_MEASURED
        self.arch_ids = list(arch_ids)
        self.predicted_ms = list(predicted_ms)
        self.engines = list(engines)
        self._index = {a: i for i, a in enumerate(self.arch_ids)}
        self._windows = [_Window(self.settings.window) for _ in self.arch_ids]
        self._r_variant: list[float | None] = [None] * len(self.arch_ids)
        self._r_engine: dict[str, float] = {}
        self._rel: list[float | None] = [None] * len(self.arch_ids)
        self._prior_r = [1.0] * len(self.arch_ids)  # r of each prior, as of the last refresh
        self.tail_factor = self.settings.default_tail
        self.samples = 0
        self._measured: list[float | None] = [None] * len(self.arch_ids)  # tails as of the last refresh

    def set_engine(self, arch_id: str, engine: str) -> None:
        """The engine a variant really runs on (known once loaded); its r falls back to that engine's."""
        self.engines[self._index[arch_id]] = engine

    def observe(self, arch_id: str, measured_ms: float, predicted_ms: float, now_s: float) -> None:
        """One measured compute time of ``arch_id`` against the prediction for that run (load-scaled, no r)."""
        i = self._index.get(arch_id)
        if i is None or not (math.isfinite(measured_ms) and measured_ms >= 0):
            return
        window = self._windows[i]
        window.times.append(now_s)
        window.values.append(measured_ms)
        window.dirty = True
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

    def ratio(self, arch_id: str) -> float | None:
        return self._r_variant[self._index[arch_id]]

    def engine_ratio(self, engine: str) -> float | None:
        return self._r_engine.get(engine)

    def refresh(self, now_s: float) -> int:
        """Summarise the windows at ``now_s``: which variants have enough fresh samples, their
        tail latencies, and the tail factor for the priors. Returns how many are measured.

        Separate from :meth:`latencies` so the decision itself stays a few list operations
        (the loop times both: ``estimate_us`` and ``decision_us``).
        """
        if not self.measure:
            return 0
        s = self.settings
        measured = self._measured
        tails: list[float] = []
        count = 0
        for i, window in enumerate(self._windows):
            n = window.fresh(now_s, s.max_age_s)
            if n >= s.min_samples:
                tail, median = window.quantiles(n, s.quantile)
                if median > 0:
                    tails.append(tail / median)
                measured[i] = tail
                count += 1
            else:
                measured[i] = None
        if tails:  # the priors are tail latencies too, with the spread measured now
            self.tail_factor = max(1.0, sum(tails) / len(tails))
        for i, rel in enumerate(self._rel):
            r_engine = self._r_engine.get(self.engines[i])
            if r_engine is None:
                self._prior_r[i] = self._r_variant[i] or 1.0
            else:
                self._prior_r[i] = r_engine * (1.0 if rel is None else rel)
        return count

    def latencies(self, load_scale: float) -> tuple[list[float], list[float]]:
        """Per variant (as of the last :meth:`refresh`): the tail latency to decide on, and its
        ratio to the load-scaled prediction (energy is scaled by it)."""
        predicted = self.predicted_ms
        if not self.measure:
            return [t * load_scale for t in predicted], [1.0] * len(predicted)
        out = []
        ratios = []
        tail_factor = self.tail_factor
        prior_r = self._prior_r
        for i, tail in enumerate(self._measured):
            prior_ms = predicted[i] * load_scale
            if tail is not None:
                out.append(tail)
                ratios.append(tail / prior_ms)
                continue
            r = prior_r[i]
            out.append(prior_ms * r * tail_factor)
            ratios.append(r)
        return out, ratios

    def estimates(self, now_s: float, load_scale: float) -> list[Estimate]:
        """Every variant's estimate with its source (for status and metrics)."""
        s = self.settings
        self.refresh(now_s)
        latencies, _ = self.latencies(load_scale)
        result = []
        for i, arch_id in enumerate(self.arch_ids):
            n = self._windows[i].fresh(now_s, s.max_age_s)
            r = self._r_variant[i]
            source = SOURCE_MEASURED if self._measured[i] is not None else SOURCE_PRIOR
            result.append(Estimate(arch_id, latencies[i], source, n, r,
                                   r is not None and not self.r_min <= r <= self.r_max))
        return result

    def disagreements(self) -> dict[str, float]:
        """Variants whose measured/predicted ratio is outside [r_min, r_max]: the measurement wins."""
        return {a: r for a, r in zip(self.arch_ids, self._r_variant, strict=True)
                if r is not None and not self.r_min <= r <= self.r_max}

    def stale(self, arch_id: str, now_s: float) -> bool:
        """Whether ``arch_id`` lacks ``min_samples`` fresh samples (a shadow run would help)."""
        window = self._windows[self._index[arch_id]]
        return window.fresh(now_s, self.settings.max_age_s) < self.settings.min_samples
