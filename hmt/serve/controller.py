"""The on-device adaptation loop: monitor -> load index -> measured estimates -> eq. 3 -> switch.

One :class:`Controller` per served bundle. Its control thread takes a resource sample
every ``monitor_period_s`` (and on demand: a request over its latency budget, a budget
change, or a pending budget violation asks for a decision at most every
``on_demand_min_interval_s``), computes the load index of the load *outside* serve
(AdaScale eq. 2 minus serve's own CPU time) and its AR forecast, and estimates every
variant's tail latency: **measured first** (the p95 of its recent compute times, from
served requests and from shadow runs of loaded idle variants), the profile's prediction
only as a prior until measurements exist, scaled by the profile's load model
(``1 + alpha * I``) and by ``r = measured / predicted`` kept per variant and per engine
(:mod:`hmt.serve.estimates`). It chooses by CrowdHMTware eq. 3 within the latency,
memory and energy budgets and offers the choice to the hysteresis switcher. When
nothing is feasible it serves the fastest and says so. A switch to a variant that is not
loaded loads it on the control thread while the old one keeps serving; a failed load
(a runtime error, or a graph whose sha256 no longer matches the manifest) is reverted,
the old variant stays, and status says why.

Requests call :meth:`Controller.predict` from any thread: it reads the active runner
(one reference, swapped atomically), runs it, and records the measured time.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from hmt.bundle import Bundle
from hmt.errors import DeviceError, HmtError, ModelError
from hmt.runtime.chain import ChainResult, Runner
from hmt.runtime.variant import bundle_providers
from hmt.serve.decision import DecisionPath
from hmt.serve.estimates import LatencyEstimator
from hmt.serve.load_index import LoadForecaster, load_index_of
from hmt.serve.monitor import ResourceMonitor, ResourceSample, Sampler
from hmt.serve.optimizer import (
    Decision,
    Optimizer,
)
from hmt.serve.pool import Loader, VariantPool
from hmt.serve.records import Prediction, Stats, TickRecord
from hmt.serve.settings import Budgets, ServeSettings
from hmt.serve.switcher import STAY_VIOLATION_PENDING, Switcher
from hmt.serve.table import optimizer_config, variants_of

TRIGGER_INITIAL = "initial"
TRIGGER_PERIODIC = "periodic"
TRIGGER_ON_DEMAND = "on_demand"
# A variant that failed to load is not tried again for this long (each try costs a load).
LOAD_RETRY_S = 30.0
QUEUE_WINDOW = 32  # requests whose queue wait sets the serving overhead (median)
# The decision sees the load forecast in steps of this (a load index bucket) and the serving
# overhead in steps of 1% of the latency budget (rounded up: never more budget than measured),
# so that its inputs change only when they change enough to matter and the cached decision holds.
LOAD_STEP = 0.02
OVERHEAD_STEPS = 100


class Controller:
    """Adaptation loop + inference entry point of one bundle (see the module docstring)."""

    def __init__(
        self,
        bundle: Bundle,
        settings: ServeSettings | None = None,
        *,
        engine: str | None = None,
        threads: int | None = None,
        sampler: Sampler | None = None,
        fixed_variant: str | None = None,
        on_tick: Callable[[TickRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        loader: Loader | None = None,
        warmup_runs: int = 3,
        providers: Sequence[str] | None = None,
        adapt: Any = None,
    ) -> None:
        self.bundle = bundle
        # None: the providers the bundle's target lists (hmt.deploy.targets), CPU for older bundles.
        self.providers = tuple(providers) if providers is not None else bundle_providers(bundle)
        self.settings = settings if settings is not None else ServeSettings.from_mapping(bundle.serve_config)
        self.engine = engine if engine is not None else self.settings.engine
        self._clock = clock
        self.t0_s = clock()  # the controller's time zero on ``clock``
        config, self.alpha_source = optimizer_config(bundle, self.settings)
        self.optimizer = Optimizer(variants_of(bundle), config)
        if fixed_variant is not None:
            self.optimizer.variant(fixed_variant)  # unknown id: UsageError naming it
        self.fixed_variant = fixed_variant
        self.switcher = Switcher(self.settings.switch, clock=clock)
        table = self.optimizer.variants
        c = self.settings.correction
        engines = [bundle.spec.variant(v.arch_id).preferred_engine for v in table]
        self.estimator = LatencyEstimator([v.arch_id for v in table], [v.latency_ms for v in table], engines,
                                          self.settings.estimates, smoothing=c.smoothing, r_min=c.r_min,
                                          r_max=c.r_max, alpha_latency=self.optimizer.alpha_latency)
        self._known_ids = frozenset(v.arch_id for v in table)  # the pool may also hold serve --adapt's variant
        # The decision path, cached on what a choice depends on (hmt.serve.decision).
        self.decision = DecisionPath(self.optimizer, fixed_variant, self.settings.switch.score_margin)
        # Requests in a row over the budget on the active variant (the switcher's fast attack).
        self._miss_streak = 0
        self._measured_count = 0
        self.forecaster = LoadForecaster(order=2, window=60)
        self._recent_load: deque[float] = deque(maxlen=5)
        self.monitor = ResourceMonitor(sampler, frequency_hz=1.0 / self.settings.monitor_period_s)
        self.pool = VariantPool(bundle, engine=self.engine, threads=threads, warmup_runs=warmup_runs, loader=loader,
                                early_exit=self.settings.early_exit.enabled, providers=self.providers)
        self.budgets: Budgets = self.settings.budgets
        self._active: Runner | None = None
        self._load_scale = 1.0  # (1 + alpha * I) of the last decision
        self._state_lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_tick_s = -math.inf
        self._pending = False  # an on-demand decision was asked for
        self._on_tick = on_tick
        self.ticks: deque[TickRecord] = deque(maxlen=256)
        self.stats = Stats()
        # Effective settings and where each came from (hmt.serve.overrides; set by the session), for status.
        self.settings_report: dict[str, dict[str, Any]] | None = None
        # Called with each decision's optimizer + switcher time in seconds (the metrics' histogram).
        self.decision_observers: list[Callable[[float], None]] = []
        self.last_error: str | None = None
        self.last_decision: Decision | None = None
        self._failed_loads: dict[str, float] = {}
        # Queue wait per request: the budget's share no variant can use. The median of the last
        # QUEUE_WINDOW requests, not a mean: one stall of the machine (hundreds of ms) must not
        # make every variant infeasible and send the loop switching on noise no choice can fix.
        self.overhead_ms = 0.0
        self._queue_waits: deque[float] = deque(maxlen=QUEUE_WINDOW)
        self._inflight = 0
        self._last_input: np.ndarray | None = None
        self._shadow_next = 0
        share = self.settings.estimates.probe_share
        self._probe_every = round(1.0 / share) if share > 0 else 0  # requests (see _probe)
        self._request_count = 0
        self._load_now = 0.0  # outside load index of the last tick (shadow runs wait for idle)
        # serve --adapt (hmt.serve.adapt.AdaptSettings, canary): BN re-estimation off the request path.
        self.adapt: Any = None
        if adapt is not None:
            from hmt.serve.adapt import AdaptService

            settings_, canary = adapt
            self.adapt = AdaptService(bundle, self.pool, lambda: self.active_arch_id, settings_, canary, clock=clock)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        runner = self._active
        return runner is not None and runner.warm

    @property
    def active_arch_id(self) -> str | None:
        runner = self._active
        return None if runner is None else runner.arch_id

    def now_s(self) -> float:
        return self._clock() - self.t0_s

    def start(self, background: bool = True) -> None:
        """Choose and load the first variant, preload others within the budget, start the loop."""
        self.tick(TRIGGER_INITIAL)
        if self._active is None:
            raise ModelError(f"no variant of {self.bundle.root} could be loaded: {self.last_error}")
        order = [self._active.arch_id]
        by_latency = sorted(self.bundle.spec.variants, key=lambda v: v.latency_ms)
        order.append(by_latency[0].arch_id)  # the fallback when budgets tighten
        order.extend(v.arch_id for v in sorted(self.bundle.spec.variants, key=lambda v: -v.accuracy))
        if self.fixed_variant is None:
            self.pool.preload([a for a in dict.fromkeys(order) if a not in self._failed_loads], self._capacity_bytes())
            # The engine each preloaded variant really runs on: its prior takes that engine's r.
            # (Without this a variant never run kept the bundle's preferred engine, whose r nothing
            # measured under serve --engine tvm: its prior was the ORT profile's 0.6 ms for a
            # variant TVM runs in 40.)
            for arch_id in self.pool.loaded_ids():
                runner = self.pool.get(arch_id)
                if runner is not None and arch_id in self._known_ids:
                    self.estimator.set_engine(arch_id, runner.engine)
        if background:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="hmt-serve-controller", daemon=True)
            self._thread.start()
            if self.adapt is not None:
                self.adapt.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self.adapt is not None:
            self.adapt.stop(timeout_s)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise DeviceError(f"serve control thread did not stop within {timeout_s} s")
        self.monitor.stop()

    def _loop(self) -> None:
        period_s = self.settings.monitor_period_s
        min_gap_s = self.settings.on_demand_min_interval_s
        next_s = self._clock() + period_s
        while not self._stop.is_set():
            now = self._clock()
            wait_s = next_s - now
            if self._pending:
                wait_s = min(wait_s, self._last_tick_s + min_gap_s - now)
            # Idle variants are measured between decisions (bounded share), never instead of one.
            if wait_s > 0.02 and self.shadow_run():
                continue
            self._wake.wait(max(0.0, min(wait_s, 0.1) if self._shadow_wanted() else wait_s))
            self._wake.clear()
            if self._stop.is_set():
                return
            now = self._clock()
            if self._pending and now - self._last_tick_s >= min_gap_s:
                self._pending = False
                trigger = TRIGGER_ON_DEMAND
            elif now >= next_s:
                trigger = TRIGGER_PERIODIC
                next_s = max(next_s + period_s, now)  # fell behind: do not burst
            else:
                continue
            with contextlib.suppress(HmtError):  # recorded in last_error by tick
                self.tick(trigger)

    def request_tick(self) -> bool:
        """Ask the control thread for a decision soon: now, or ``on_demand_min_interval_s`` after
        the last one. Requests in between merge into one. False when the loop is not running."""
        if self._thread is None:
            return False
        self._pending = True
        self._wake.set()
        return True

    # -- shadow runs ---------------------------------------------------------------------------

    def _shadow_candidates(self) -> list[str]:
        if self.fixed_variant is not None or not self.estimator.measure or self._last_input is None:
            return []
        active = self.active_arch_id
        now = self.now_s()
        known = self._known_ids
        return [a for a in self.pool.loaded_ids() if a != active and a in known and self.estimator.stale(a, now)]

    def _shadow_wanted(self) -> bool:
        estimates = self.settings.estimates
        share = estimates.shadow_share
        return share > 0 and self._load_now < estimates.shadow_max_load and bool(self._shadow_candidates()) \
            and self.stats.shadow_s <= share * max(self.now_s(), 1e-3)

    def shadow_run(self) -> bool:
        """Run one stale, loaded, idle variant on a recent input and record its time (issue 14 item 1).

        Only while the device is idle (outside load index below ``estimates.shadow_max_load``),
        no request is in flight and the shadow time so far is within ``estimates.shadow_share``
        of the wall time: measurements of the alternatives must not cost the requests being
        served (on busy cores the priors follow the engine's r instead). Returns whether a run
        happened.
        """
        if self._inflight or not self._shadow_wanted():
            return False
        candidates = self._shadow_candidates()
        arch_id = candidates[self._shadow_next % len(candidates)]
        self._shadow_next += 1
        runner = self.pool.get(arch_id)
        x = self._last_input
        if runner is None or x is None or not runner.warm:
            return False
        early = self.settings.early_exit
        start = time.perf_counter()
        try:
            result = runner.run(x, early.confidence if early.enabled else None)
        except HmtError as exc:
            self.last_error = f"shadow run of {arch_id!r} failed: {exc}"
            return False
        spent_s = time.perf_counter() - start
        predicted_ms = runner.variant.latency_ms * self._load_scale * result.predicted_share
        with self._state_lock:
            self.estimator.observe(arch_id, result.compute_ms, predicted_ms, self.now_s(), self._load_now)
            self.stats.shadow_runs += 1
            self.stats.shadow_s += spent_s
        return True

    def _probe(self, base: Runner) -> Runner | None:
        """Every ``1 / estimates.probe_share``-th request: the nearest variant faster than ``base``
        (by the profile's order) with no measurement within ``estimates.memory_s``, loaded and
        warm, to serve it instead (its measurement calibrates the variant's prior); else None."""
        every = self._probe_every
        if not every or self.fixed_variant is not None or not self.estimator.measure:
            return None
        self._request_count += 1
        if self._request_count % every:
            return None
        optimizer = self.optimizer
        since_s = self.now_s() - self.settings.estimates.memory_s
        for variant in reversed(optimizer.variants[:optimizer.position(base.arch_id)]):
            if not self.estimator.measured_since(variant.arch_id, since_s):
                runner = self.pool.get(variant.arch_id)
                if runner is not None and runner.warm:
                    return runner
        return None

    # -- budgets ---------------------------------------------------------------------------

    def set_budgets(self, latency_ms: float | None, memory_mb: float | None, energy: float | None = None,
                    *, keep_energy: bool = True) -> None:
        """Replace the run-time budgets (``None``: unconstrained; the energy budget is kept unless
        ``keep_energy=False``) and ask for a decision."""
        new = Budgets(latency_ms=latency_ms, memory_mb=memory_mb,
                             energy=self.budgets.energy if keep_energy and energy is None else energy)
        if new != self.budgets:
            self.budgets = new
            self.request_tick()

    def _capacity_bytes(self) -> int | None:
        limits = [m for m in (self.settings.preload_memory_mb, self.budgets.memory_mb) if m is not None]
        return int(min(limits) * 1e6) if limits else None

    # -- the decision ------------------------------------------------------------------------

    def tick(self, trigger: str = TRIGGER_ON_DEMAND, sample: ResourceSample | None = None) -> TickRecord:
        """One pass of the loop; serialised (concurrent callers wait for each other)."""
        with self._tick_lock:
            return self._tick(trigger, sample)

    def _load(self, sample: ResourceSample) -> tuple[float, float, float | None]:
        """(load index now, forecast for the next period, serve's own CPU share)."""
        own = sample.own_cpu_util  # measured by the live sampler; a synthetic sample is outside load already
        outside = sample if own is None else replace(sample, cpu_util=max(0.0, sample.cpu_util - own))
        load_now = self._load_now = load_index_of(outside, self.settings.load_weights)
        self.forecaster.update(load_now)
        recent = self._recent_load
        recent.append(load_now)
        # An AR fit over a step-like window can overshoot wildly (we saw 1.0 and 0.0 forecast
        # right after a step from 0.02 to 0.27): keep its smoothing, not its extrapolation.
        load_next = min(max(recent), max(min(recent), float(self.forecaster.forecast(1)[0])))
        return load_now, load_next, own

    def _estimate(self, load_next: float, load_now: float, latency_limit_ms: float,
                  budgets: Budgets) -> tuple[int, int]:
        """The estimate stage of a tick (timed as ``estimate_us``): file the samples since the last
        tick under the load measured over them, refresh the estimates (kept up to date on each
        measurement, so this re-reads only what changed) and reduce them to the feasible set
        (:meth:`DecisionPath.feasible`). The decision is at the forecast ``load_next``, with what
        the variants measured at ``load_now`` as a floor (a step shows in the requests first)."""
        estimator = self.estimator
        now_s = self.now_s()
        with self._state_lock:
            estimator.refile(load_now, now_s)
            self._measured_count = estimator.refresh(now_s)
        latencies, ratios = estimator.latencies(1.0 + self.optimizer.alpha_latency * load_next, load_next, load_now)
        return self.decision.feasible(latencies, ratios, load_next, latency_limit_ms, budgets)

    def _latency_limit_ms(self, budgets: Budgets) -> tuple[float, float]:
        """(compute share of the latency budget, serving overhead): the budget covers queue wait +
        compute; the estimates are compute alone, so they get what the serving overhead measured
        now leaves of it (times the headroom). Infinite without a latency budget."""
        waits = sorted(self._queue_waits)
        overhead_ms = waits[len(waits) // 2] if waits else 0.0
        budget_ms = budgets.latency_ms
        if budget_ms is None:
            return math.inf, overhead_ms
        step = budget_ms / OVERHEAD_STEPS
        overhead_q = math.ceil(overhead_ms / step - 1e-9) * step
        return max(1e-3, self.settings.correction.headroom * budget_ms - overhead_q), overhead_ms

    def _tick(self, trigger: str, sample: ResourceSample | None) -> TickRecord:
        self._last_tick_s = self._clock()
        if sample is None:
            sample = self.monitor.sample_now()
        load_now, load_next, own = self._load(sample)
        load_next = round(load_next / LOAD_STEP) * LOAD_STEP  # the load index bucket
        budgets = self.budgets
        latency_limit_ms, overhead_ms = self._latency_limit_ms(budgets)
        self.overhead_ms = overhead_ms
        miss_streak = self.settings.switch.miss_streak
        confirmed = miss_streak > 0 and self._miss_streak >= miss_streak
        # mu from the battery reading, like the load index from the CPU reading: an input of the
        # decision, derived from the sample before it.
        mu = self.decision.mu(sample)
        e0 = time.perf_counter()
        mask = self._estimate(load_next, load_now, latency_limit_ms, budgets)
        e1 = time.perf_counter()
        cpu0 = time.thread_time_ns()  # outside the wall-time span: the call itself costs a few us
        t0 = time.perf_counter()
        switcher = self.switcher
        choice = self.decision.choose(mask, mu, switcher.active_arch_id, switcher.home)
        result = switcher.offer(choice, confirmed=confirmed)  # the switcher reads our clock if it needs it
        t1 = time.perf_counter()
        decision_cpu_us = (time.thread_time_ns() - cpu0) / 1e3
        decision_us = (t1 - t0) * 1e6
        estimate_us = (e1 - e0) * 1e6
        measured = self._measured_count
        load_scale = self.decision.inputs[2]
        decision = self.decision.record(choice, load_next, latency_limit_ms, mu, budgets)
        with self._state_lock:
            self.stats.decision_us.append(decision_us)
            self.stats.infeasible_ticks += not decision.feasible
        for observe in self.decision_observers:
            observe(decision_us / 1e6)
        if result.switched:
            self._miss_streak = 0  # the streak was the old variant's
        self._load_scale = load_scale
        self.last_decision = decision
        error = self._apply(result)
        active = self._active.arch_id if self._active is not None else result.active_arch_id
        adopted = self.adapt.adopted_arch_id if self.adapt is not None else None
        self.pool.trim(self._capacity_bytes(), keep={active} if adopted is None else {active, adopted})
        if error is not None:
            self.last_error = error
        elif result.switched or trigger == TRIGGER_INITIAL:
            self.last_error = None  # a stale error must not outlive the state it described
        estimates = {e.arch_id: e for e in self.estimator.estimates(self.now_s(), load_scale, load_next)}
        active_estimate = estimates[active]
        record = TickRecord(
            time_s=self.now_s(), trigger=trigger, cpu_util=sample.cpu_util, mem_util=sample.mem_util,
            gpu_util=sample.gpu_util, battery_percent=sample.battery_percent, temperature_c=sample.temperature_c,
            load_index=load_now, load_forecast=load_next,
            latency_ratio=active_estimate.ratio if active_estimate.ratio is not None else 1.0,
            overhead_ms=overhead_ms, mu=decision.mu,
            latency_budget_ms=budgets.latency_ms, memory_budget_mb=budgets.memory_mb,
            proposed=decision.arch_id, active=active, switched=result.switched and error is None,
            switch_reason=result.reason, feasible=decision.feasible,
            predicted_latency_ms=active_estimate.latency_ms, decision_us=decision_us,
            decision_cpu_us=decision_cpu_us, error=error, own_cpu_util=own,
            estimate_source=active_estimate.source, measured_variants=measured, energy_budget=budgets.energy,
            estimate_us=estimate_us,
        )
        with self._state_lock:
            self.ticks.append(record)
        if result.reason == STAY_VIOLATION_PENDING:
            # Patience counts decisions: ask for the next one soon rather than a period later.
            self._pending = True
        if self._on_tick is not None:
            self._on_tick(record)
        return record

    def _apply(self, result: Any) -> str | None:
        """Load the switcher's choice if it is not the active runner; a failure reverts the switch."""
        if not (result.switched or self._active is None or self._active.arch_id != result.active_arch_id):
            return None
        failed_at = self._failed_loads.get(result.active_arch_id)
        try:
            if failed_at is not None and self._clock() - failed_at < LOAD_RETRY_S:
                raise ModelError(f"variant {result.active_arch_id!r} failed to load "
                                 f"{self._clock() - failed_at:.1f} s ago; retrying after {LOAD_RETRY_S:g} s")
            runner = self.pool.load(result.active_arch_id)
        except ModelError as exc:
            self.stats.load_failures += 1
            if failed_at is None or self._clock() - failed_at >= LOAD_RETRY_S:  # a real try, not a skip
                self._failed_loads[result.active_arch_id] = self._clock()
            if result.switched:
                self.switcher.revert(result)
            if self._active is None:
                self._fallback_initial(result.active_arch_id)
            return str(exc)
        self._active = runner
        self.estimator.set_engine(runner.arch_id, runner.engine)
        self._failed_loads.pop(result.active_arch_id, None)
        return None

    def _fallback_initial(self, failed: str) -> None:
        """The first choice failed to load: take the first variant (fastest first) that loads."""
        for variant in sorted(self.optimizer.variants, key=lambda v: v.latency_ms):
            if variant.arch_id == failed:
                continue
            try:
                runner = self.pool.load(variant.arch_id)
            except ModelError as exc:
                self.last_error = str(exc)
                continue
            self.switcher = Switcher(self.settings.switch, clock=self._clock)
            self.switcher.offer(replace(self.optimizer.decide(), arch_id=variant.arch_id), now_s=self._clock())
            self._active = runner
            return

    # -- requests ------------------------------------------------------------------------------

    def predict(self, x: np.ndarray, queued_ms: float = 0.0) -> Prediction:
        """Answer one input (already validated to the bundle's input spec) with the active variant
        (or, for a share of requests, a faster one not measured lately: :meth:`_probe`)."""
        base = self.active_runner()
        probe = self._probe(base) if base.arch_id in self._known_ids else None
        # serve --adapt: the adapted variant of the active one, when the guard adopted it.
        runner = probe if probe is not None else base if self.adapt is None else self.adapt.runner_for(base)
        early = self.settings.early_exit
        with self.running():
            result = runner.run(x, early.confidence if early.enabled else None)
        if self.adapt is not None and probe is None:
            self.adapt.offer(x)  # a non-blocking put: adaptation runs on its own thread
        return self.record(runner, base if probe is None else probe, x, result, queued_ms)

    def active_runner(self) -> Runner:
        """The runner answering requests now; DeviceError before the first variant is warm."""
        base = self._active
        if base is None or not base.warm:
            raise DeviceError("no variant is loaded and warm yet")
        return base

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Marks inference in flight (shadow runs wait for none)."""
        self._inflight += 1
        try:
            yield
        finally:
            self._inflight -= 1

    def record(self, runner: Runner, measured: Runner, x: np.ndarray, result: ChainResult,
               queued_ms: float) -> Prediction:
        """File one answered input: ``measured`` is the bundled variant its compute time counts for."""
        self._last_input = x
        latency_ms = queued_ms + result.compute_ms
        budget_ms = self.budgets.latency_ms
        miss = budget_ms is not None and latency_ms > budget_ms
        predicted_ms = runner.variant.latency_ms * self._load_scale * result.predicted_share
        now_s = self.now_s()
        with self._state_lock:
            # The estimates are per bundled variant: an adapted one's time counts for its base.
            self.estimator.observe(measured.arch_id, result.compute_ms, predicted_ms, now_s, self._load_now)
            self._queue_waits.append(max(0.0, queued_ms))
            stats = self.stats
            stats.requests += 1
            stats.deadline_misses += miss
            stats.per_exit[result.exit] += 1
            stats.per_variant[runner.arch_id] += 1
            stats.latency_ms.append(latency_ms)
            stats.latency_sum_ms += latency_ms
        if runner is self._active:
            self._miss_streak = self._miss_streak + 1 if miss else 0
        if miss:
            self.request_tick()
        return Prediction(result.class_index, result.confidence, result.exit, runner.arch_id, result.compute_ms,
                          latency_ms, miss, result.probabilities)

    # -- reporting -------------------------------------------------------------------------------

    def windows(self) -> tuple[list[float], list[float], float, int]:
        """Recent latencies (ms), recent decision times (us), latency sum (ms) and request count, consistently."""
        with self._state_lock:
            stats = self.stats
            return list(stats.latency_ms), list(stats.decision_us), stats.latency_sum_ms, stats.requests

    def status(self, last: int = 10) -> dict[str, Any]:
        with self._state_lock:
            ticks = list(self.ticks)
            stats = self.stats
            lat = np.array(stats.latency_ms) if stats.latency_ms else None
            dec = np.array(stats.decision_us) if stats.decision_us else None
            requests = stats.requests
            misses = stats.deadline_misses
            per_exit = {str(k): v for k, v in sorted(stats.per_exit.items())}
            per_variant = dict(stats.per_variant)
            shadow_runs, shadow_s = stats.shadow_runs, stats.shadow_s
            estimates = {e.arch_id: {"latency_ms": e.latency_ms, "source": e.source, "samples": e.samples,
                                     "ratio": e.ratio, "disagrees": e.disagrees}
                         for e in self.estimator.estimates(self.now_s(), self._load_scale)}
            disagreements = self.estimator.disagreements()
            engine_ratios = {e: self.estimator.engine_ratio(e) for e in sorted(set(self.estimator.engines))}
        latest = ticks[-1] if ticks else None
        decision = self.last_decision
        capacity = self._capacity_bytes()
        return {
            "ready": self.ready,
            "variant": self.active_arch_id,
            "engine": self._active.engine if self._active is not None else None,
            # What really runs: fuse's merged chain or graph by graph, and any provider fallback.
            "layout": self._active.layout if self._active is not None else None,
            "runtime_notes": list(self._active.notes) if self._active is not None else [],
            "providers": list(self.providers),
            "fixed_variant": self.fixed_variant,
            "uptime_s": self.now_s(),
            "load_index": None if latest is None else latest.load_index,
            "load_forecast": None if latest is None else latest.load_forecast,
            "latency_ratio": None if latest is None else latest.latency_ratio,
            "overhead_ms": self.overhead_ms,
            "mu": None if latest is None else latest.mu,
            "budgets": {"latency_ms": self.budgets.latency_ms, "memory_mb": self.budgets.memory_mb},
            "energy_budget": self.budgets.energy,  # per inference, the profile's energy unit (None: unconstrained)
            "load_model": {"alpha_latency": self.optimizer.alpha_latency, "source": self.alpha_source},
            "own_cpu_util": None if latest is None else latest.own_cpu_util,
            "estimates": estimates,
            "engine_ratios": engine_ratios,
            # Measured / predicted outside [r_min, r_max]: the measurement is what decides.
            "prediction_disagrees": disagreements,
            "feasible": None if decision is None else decision.feasible,
            "infeasible_reason": None if decision is None or decision.feasible else decision.reason,
            "shadow": {"runs": shadow_runs, "seconds": shadow_s,
                       "share_limit": self.settings.estimates.shadow_share},
            "early_exit": asdict(self.settings.early_exit),
            "pool": {"loaded": self.pool.loaded_ids(), "loaded_mb": self.pool.loaded_bytes() / 1e6,
                     "capacity_mb": None if capacity is None else capacity / 1e6,
                     "loads": self.pool.load_count, "load_failures": self.pool.load_failures,
                     "evictions": self.pool.evictions, "integrity_failures": self.pool.integrity_failures},
            # Decisions answered from the cache (same feasible set, mu and active variant).
            "decision_cache": {"hits": self.decision.hits, "entries": self.decision.entries},
            "switches": self.switcher.switch_count,
            "requests": requests,
            "deadline_misses": misses,
            "per_exit": per_exit,
            "per_variant": per_variant,
            "latency_ms": None if lat is None else {"p50": float(np.percentile(lat, 50)),
                                                     "p95": float(np.percentile(lat, 95))},
            "decision_us_p50": None if dec is None else float(np.median(dec)),
            "last_error": self.last_error,
            "adapt": None if self.adapt is None else self.adapt.status(),
            "last_decisions": [t.to_json_dict() for t in ticks[-last:]],
        }
