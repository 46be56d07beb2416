"""Measuring the variants that are not serving (issue 14 item 1), so their estimates stay measured.

- shadow runs: between decisions, a stale, loaded, idle variant runs on a recent input, within a
  bounded share of the wall time. The active variant's *neighbours* (the nearest faster variant,
  where the loop falls back to, and its *climb target*, where it would go up to) are kept fresh
  at any load: each is run in a burst until its window at the current load level holds
  ``min_samples`` samples within ``max_age_s``, so the decision compares estimates of the
  machine as it is now. The climb target is the best-scoring slower variant (eq. 3) that beats
  the active one by the switcher's margin (one within the margin is never switched to, so
  measuring it would not move the loop) and for which there is room: the active variant's
  estimate, scaled by their profiled latencies, within the compute limit (a burst of a variant
  that cannot fit costs the requests CPU and tells the loop nothing it can use), and that was
  not just measured over the limit (then the next one down the score order is measured, until
  the first one's samples age out; after that, while its estimate at this load is still over the
  limit, it takes turns with the next one not measured since). Other variants are measured only
  while the device is idle. Shadow time is counted on the controller's clock, the one the share
  is read on.

  Without the neighbours' refresh (issue 28) a variant measured during a spike kept that
  estimate for ``memory_s`` (30 s): on a shared or busy machine the outside load index sits over
  ``shadow_max_load`` (0.8 on a 2-core machine with other jobs, idle phase and busy phase
  alike), so no shadow run ever happened, and probes re-measure a faster variant only once per
  ``memory_s``. The loop then stayed below a largest variant that fitted again, or fell back
  to the variant whose stale estimate from a quiet moment was the lowest, and missed as often
  as the static largest (``benchmarks/serve/results/loop_trace.json``);
- probes: every ``1 / estimates.probe_share``-th request is served by the nearest faster
  variant not measured lately, whose measurement calibrates its prior.

A shadow run times the variant's longest path (every segment, and with early exit on every head),
whatever exit the replayed input would take: see :meth:`ShadowRuns.run`.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator

import numpy as np

from hmt.errors import HmtError
from hmt.runtime.chain import Runner
from hmt.runtime.settings import ServeSettings
from hmt.serve.deciding.estimates import LatencyEstimator
from hmt.serve.deciding.optimizer import Optimizer
from hmt.serve.reporting.records import Stats
from hmt.serve.running.pool import VariantPool


class ShadowRuns:
    """Shadow runs and probes of one controller's variants (``fixed``: one variant only, none)."""

    def __init__(self, pool: VariantPool, estimator: LatencyEstimator, settings: ServeSettings, stats: Stats,
                 state_lock: threading.Lock, known_ids: frozenset[str], *, fixed: bool,
                 now_s: Callable[[], float]) -> None:
        self.pool = pool
        self.estimator = estimator
        self.settings = settings
        self.stats = stats
        self._state_lock = state_lock
        self._known_ids = known_ids  # the pool may also hold serve --adapt's variant
        self._fixed = fixed
        self._now_s = now_s
        self.last_input: np.ndarray | None = None  # the latest request's input, run by shadow runs
        self._next = 0
        self._burst: str | None = None  # the variant being refreshed (run until it is fresh)
        self.optimizer: Optimizer | None = None  # the table's latency order (set by the controller)
        self.limit_ms = float("inf")  # the compute share of the latency budget (set by each tick)
        self.mu = 1.0  # eq. 3's accuracy weight of the last decision (set by each tick)
        share = settings.estimates.probe_share
        self._probe_every = round(1.0 / share) if share > 0 else 0  # requests (see probe)
        self._request_count = 0
        self.inflight = 0  # requests running now: shadow runs wait for none
        self.started = 0  # requests started so far: a shadow run during which one started is not kept
        self.overlapped = 0  # shadow runs not kept because a request ran beside them

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Marks a request's inference in flight."""
        self.started += 1
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    def neighbours(self, active_arch_id: str | None) -> tuple[str, ...]:
        """The nearest faster variant (by the profile's order) and the climb target (see the module
        docstring), loaded or not: where the loop falls back to and where it would climb to."""
        optimizer = self.optimizer
        if optimizer is None or active_arch_id is None or active_arch_id not in self._known_ids:
            return ()
        variants = optimizer.variants
        i = optimizer.position(active_arch_id)
        out = [variants[i - 1].arch_id] if i > 0 else []
        scores = optimizer.scores(self.mu)
        margin = self.settings.switch.score_margin
        above = sorted((k for k in range(i + 1, len(variants)) if scores[k] > scores[i] + margin),
                       key=lambda k: -scores[k])
        target = self._climb_target([variants[k].arch_id for k in above
                                     if self._room_for(variants[k].arch_id, active_arch_id)
                                     and not self._known_over(variants[k].arch_id)])
        return (*out, target) if target is not None else tuple(out)

    def _climb_target(self, targets: list[str]) -> str | None:
        """The best-scoring of ``targets``, unless its estimate at this load is over the compute limit
        (measured over it before: its samples went stale, not away) and a lower one was not measured
        since: then the best-scoring such one. Each stale burst of a variant that keeps measuring over
        the limit costs the shadow share as much as it earns meanwhile (a 14 ms variant, 5 samples
        every 1.5 s, against 5 % of the wall time), so a variant between it and the active one that
        fitted was never measured and the loop stayed on the smallest: the variants take turns."""
        if not targets:
            return None
        first = targets[0]
        estimate = self.estimator.latest(first)
        if estimate is None or estimate <= self.limit_ms:
            return first
        since_s = self.estimator.newest_sample_s(first)
        return next((other for other in targets[1:] if self.estimator.newest_sample_s(other) < since_s), first)

    def _known_over(self, arch_id: str) -> bool:
        """Whether ``arch_id`` was measured over the compute limit at this load just now (fresh):
        climbing to it cannot happen, so the next slower variant down the score order is the one
        to measure. (Without this, a largest variant that keeps measuring over the limit stayed
        the only climb target, and a variant between it and the active one that fitted was never
        measured: the loop stayed on the smallest, points below the best static choice.)"""
        estimator = self.estimator
        estimate = estimator.latest(arch_id)
        return estimate is not None and estimate > self.limit_ms and not estimator.stale(arch_id, self._now_s())

    def _candidates(self, active_arch_id: str | None, idle_load: float) -> list[str]:
        """Stale, loaded variants to measure: the neighbours at any load, the others while idle."""
        if self._fixed or not self.estimator.measure or self.last_input is None:
            return []
        now = self._now_s()
        known = self._known_ids
        stale = [a for a in self.pool.loaded_ids()
                 if a != active_arch_id and a in known and self.estimator.stale(a, now)]
        if idle_load < self.settings.estimates.shadow_max_load:
            return stale
        near = self.neighbours(active_arch_id)
        return [a for a in stale if a in near]

    def _room_for(self, arch_id: str, active_arch_id: str | None) -> bool:
        """Whether ``arch_id`` would fit the compute limit if it ran as much slower than the profile
        says as the active variant runs now (always, for a variant faster than the active one)."""
        optimizer = self.optimizer
        if optimizer is None or active_arch_id is None:
            return True
        mine, active = optimizer.variant(arch_id), optimizer.variant(active_arch_id)
        if mine.latency_ms <= active.latency_ms:
            return True
        now_ms = self.estimator.latest(active_arch_id)
        return now_ms is None or now_ms * mine.latency_ms / active.latency_ms <= self.limit_ms

    def wanted(self, active_arch_id: str | None, idle_load: float) -> bool:
        """Whether a shadow run is due (within the share, and a stale candidate at ``idle_load``: see :meth:`run`)."""
        share = self.settings.estimates.shadow_share
        return share > 0 and self.stats.shadow_s <= share * max(self._now_s(), 1e-3) \
            and bool(self._candidates(active_arch_id, idle_load))

    def run(self, active_arch_id: str | None, load_now: float, load_scale: float,
            idle_load: float) -> tuple[bool, str | None]:
        """Run one stale, loaded, idle variant on a recent input and record its time; (whether a run
        happened, the error of a failed one).

        Within ``estimates.shadow_share`` of the wall time; on a busy device (outside load index
        ``idle_load`` at or over ``estimates.shadow_max_load``) only the active variant's neighbours;
        the sample is filed at ``load_now``. The controller passes the highest index of its last few
        ticks as ``idle_load``: in a device class at a quarter of a core, the index of a busy phase
        dipped under the line for single ticks, and each dip started a run of a slow variant (about
        80 ms) that every request arriving meanwhile waited behind. A variant is run again and again
        (a burst) until it is fresh, so that its window at this load level is replaced as a whole,
        not mixed one sample at a time into the spike it kept. The caller checks no request is in
        flight.
        """
        if not self.wanted(active_arch_id, idle_load):
            return False, None
        candidates = self._candidates(active_arch_id, idle_load)
        if self._burst in candidates:
            arch_id = self._burst
        else:
            arch_id = self._burst = candidates[self._next % len(candidates)]
            self._next += 1
        runner = self.pool.get(arch_id)
        x = self.last_input
        if runner is None or x is None or not runner.warm:
            return False, None
        # The longest path a request can take (every segment, and with early exit every head: no exit
        # is confident enough), not the path of the one input replayed: a burst replays a single
        # input, and its exit alone made a window of that depth only, read as the variant's p95 (short
        # after an input that left at the first head, the whole path after one that went to the end).
        # Where more than 5 % of inputs go the whole way, that path's time is the p95.
        longest = math.inf if self.settings.early_exit.enabled else None
        started = self.started
        # On the controller's clock, as the share it is held to (wanted): the two read the same time.
        start_s = self._now_s()
        try:
            result = runner.run(x, longest)
        except HmtError as exc:
            return False, f"shadow run of {arch_id!r} failed: {exc}"
        spent_s = self._now_s() - start_s
        # A request that ran beside it took CPU the variant would have had were it serving (its own
        # requests would be the only work then): not kept. Kept, such runs made a shadow-measured
        # variant read 1.3-2x its time served alone, and with the window's upper p95 bound (its
        # largest sample at 5) the loop never climbed to a largest variant that met the budget.
        clean = self.started == started and not self.inflight
        predicted_ms = runner.variant.latency_ms * load_scale * result.predicted_share
        with self._state_lock:
            if clean:
                self.estimator.observe(arch_id, result.compute_ms, predicted_ms, self._now_s(), load_now)
            else:
                self.overlapped += 1
            self.stats.shadow_runs += 1
            self.stats.shadow_s += spent_s
        return True, None

    def probe(self, base: Runner, optimizer: Optimizer) -> Runner | None:
        """Every ``1 / estimates.probe_share``-th request: the nearest variant faster than ``base``
        (by the profile's order) with no measurement within ``estimates.memory_s``, loaded and
        warm, to serve it instead (its measurement calibrates the variant's prior); else None."""
        every = self._probe_every
        if not every or self._fixed or not self.estimator.measure:
            return None
        self._request_count += 1
        if self._request_count % every:
            return None
        since_s = self._now_s() - self.settings.estimates.memory_s
        for variant in reversed(optimizer.variants[:optimizer.position(base.arch_id)]):
            if not self.estimator.measured_since(variant.arch_id, since_s):
                runner = self.pool.get(variant.arch_id)
                if runner is not None and runner.warm:
                    return runner
        return None
