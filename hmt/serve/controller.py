"""The on-device adaptation loop: monitor -> load index -> measured estimates -> eq. 3 -> switch.

One :class:`Controller` per served bundle wires the parts. Each tick (on its
:class:`~hmt.serve.running.loop.ControlThread`) takes a resource sample, the load outside
serve and its forecast (:mod:`hmt.serve.deciding.load`), every variant's tail latency,
measured first (:mod:`hmt.serve.deciding.estimates`), chooses by CrowdHMTware eq. 3 within
the budgets (:mod:`hmt.serve.deciding.decision`) and offers the choice to the hysteresis
switcher. When nothing is feasible it serves the fastest and says so: the profile's fastest,
unless a bigger variant's lower estimate is as new
(:meth:`~hmt.serve.deciding.optimizer.Optimizer.fallback`). A switch to a variant that is not
loaded loads it on the control thread while the old one keeps serving; a failed load is
reverted, the old variant stays, and status says why.

Requests call :meth:`Controller.predict` from any thread: it reads the active runner
(one reference, swapped atomically), runs it, and records the measured time.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hmt.bundle import Bundle
from hmt.errors import DeviceError, ModelError
from hmt.runtime.chain import ChainResult, Runner
from hmt.runtime.cpus import cpu_capacity
from hmt.runtime.ort import usable_providers
from hmt.runtime.settings import Budgets, ServeSettings
from hmt.runtime.variant import bundle_providers
from hmt.serve.deciding.decision import DecisionPath
from hmt.serve.deciding.free_memory import FreeMemory
from hmt.serve.deciding.joint import Candidate, JointPath
from hmt.serve.deciding.keep_up import RequestRate, at_own_load
from hmt.serve.deciding.load import OutsideLoad, ServingOverhead
from hmt.serve.deciding.monitor import ResourceMonitor, ResourceSample, Sampler
from hmt.serve.deciding.optimizer import Decision, Optimizer
from hmt.serve.deciding.table import estimator_for, optimizer_config, variants_of
from hmt.serve.reporting.records import Prediction, Stats, TickRecord
from hmt.serve.reporting.status import controller_status
from hmt.serve.running.blocks import make_pool
from hmt.serve.running.loop import TRIGGER_INITIAL, TRIGGER_ON_DEMAND, ControlThread
from hmt.serve.running.pool import LoadBackoff, Loader
from hmt.serve.running.shadow import ShadowRuns
from hmt.serve.running.switcher import STAY_VIOLATION_PENDING, Switcher

# The decision sees the load forecast in steps of this (a load index bucket; the serving overhead
# likewise, hmt.serve.deciding.load), so that its inputs change only when they change enough to
# matter and the cached decision holds.
LOAD_STEP = 0.02


class Controller:
    """Adaptation loop + inference entry point of one bundle (see the module docstring)."""

    def __init__(
        self,
        bundle: Bundle,
        settings: ServeSettings | None = None,
        *,
        engine: str | None = None,
        threads: int | None = None,
        max_threads: int | None = None,
        sampler: Sampler | None = None,
        fixed_variant: str | None = None,
        on_tick: Callable[[TickRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        loader: Loader | None = None,
        warmup_runs: int = 3,
        providers: Sequence[str] | None = None,
        adapt: Any = None,
        blocks: bool = False,
    ) -> None:
        self.bundle = bundle
        # None: the providers the bundle's target lists (hmt.deploy.targets), CPU for older bundles.
        self.providers = tuple(providers) if providers is not None else bundle_providers(bundle)
        self.usable_providers = usable_providers(self.providers)
        self.settings = settings if settings is not None else ServeSettings.from_mapping(bundle.serve_config)
        self.engine = engine if engine is not None else self.settings.engine
        self._clock = clock
        self.t0_s = clock()  # the controller's time zero on ``clock``
        self._init_decision(fixed_variant)
        self._init_resources(sampler, loader=loader, blocks=blocks, threads=threads, max_threads=max_threads,
                             warmup_runs=warmup_runs)
        self._init_loop(on_tick)
        self.adapt: Any = None  # serve --adapt: BN re-estimation off the request path (AdaptService)
        if adapt is not None:
            from hmt.serve.running.adapt import AdaptService

            settings_, canary = adapt
            self.adapt = AdaptService(bundle, self.pool, lambda: self.active_arch_id, settings_, canary, clock=clock)
            # The adapted copy is a gene of the decision (its memory counts), on a device alone as with a peer.
            self.attach_routes(None)

    def _init_decision(self, fixed_variant: str | None) -> None:
        """The optimizer, switcher, estimator and decision path over the bundle's variants."""
        bundle = self.bundle
        config, self.alpha_source = optimizer_config(bundle, self.settings)
        self.optimizer = Optimizer(variants_of(bundle), config)
        if fixed_variant is not None:
            self.optimizer.variant(fixed_variant)  # unknown id: UsageError naming it
        self.fixed_variant = fixed_variant
        self.switcher = Switcher(self.settings.switch, clock=self._clock)
        self.estimator = estimator_for(bundle, self.optimizer, self.settings)
        # The bundled variants' ids (the pool may also hold serve --adapt's variant).
        self._known_ids = frozenset(v.arch_id for v in self.optimizer.variants)
        # The decision path, cached on what a choice depends on (hmt.serve.deciding.decision).
        self.decision = DecisionPath(self.optimizer, fixed_variant, self.settings.switch.score_margin)
        # With a peer (attach_routes): every gene in one decision (hmt.serve.deciding.joint), and the
        # route the active variant runs as: (candidate, predicted ms, remote ms, energy) of the last tick.
        self.joint: JointPath | None = None
        self.route: tuple[Candidate, float, float, float] | None = None
        self.use_adapted = True  # the joint decision's adapt gene (serve --adapt): run the adapted copy
        self.on_evicted: Callable[[list[str]], object] | None = None  # the offload device releases them too
        # Requests in a row over the budget on the active variant (the switcher's fast attack).
        self._miss_streak = 0
        self._measured_count = 0
        self.last_decision: Decision | None = None

    def _init_resources(self, sampler: Sampler | None, *, loader: Loader | None, blocks: bool, threads: int | None,
                        max_threads: int | None, warmup_runs: int) -> None:
        """The load and resource monitors, the runner pool and the budgets."""
        self.load = OutsideLoad(self.settings.load_weights)
        self.monitor = ResourceMonitor(sampler, frequency_hz=1.0 / self.settings.monitor_period_s)
        if self.settings.cpu_quota_cores is not None:
            self.monitor.use_cpu_quota(self.settings.cpu_quota_cores)
        # What a variant would keep busy at the request rate is judged against these (hmt.serve.deciding.keep_up).
        cores = cpu_capacity().cores
        self.cores = cores if self.settings.cpu_quota_cores is None else min(cores, self.settings.cpu_quota_cores)
        self.request_rate = RequestRate()
        self.pool = make_pool(self.bundle, blocks=blocks, engine=self.engine, loader=loader, threads=threads,
                              warmup_runs=warmup_runs, providers=self.providers,
                              early_exit=self.settings.early_exit.enabled, max_threads=max_threads)
        # serve --research (hmt.serve.deciding.research_join.attach): offered every decision, searches when none fits.
        self.research: Any = None
        self.budgets: Budgets = self.settings.budgets
        # The memory budget cut to the device's free memory above serve.json memory_reserve_mb.
        self.free_memory = FreeMemory(self.settings.memory_reserve_mb)
        self._active: Runner | None = None
        self.load_scale = 1.0  # (1 + alpha * I) of the last decision

    def _init_loop(self, on_tick: Callable[[TickRecord], None] | None) -> None:
        """The control thread, its records, the serving overhead and the shadow runs."""
        self.state_lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self.loop = ControlThread(self.tick, self.shadow_run, self._shadow_wanted, clock=self._clock,
                                  period_s=self.settings.monitor_period_s,
                                  min_gap_s=self.settings.on_demand_min_interval_s)
        self._on_tick = on_tick
        self.ticks: deque[TickRecord] = deque(maxlen=256)
        self.stats = Stats()
        # Effective settings and where each came from (hmt.serve.running.overrides; set by the session), for status.
        self.settings_report: dict[str, dict[str, Any]] | None = None
        # Called with each decision's optimizer + switcher time in seconds (the metrics' histogram).
        self.decision_observers: list[Callable[[float], None]] = []
        self.last_error: str | None = None
        self.loads = LoadBackoff(self.pool, self._clock)
        # The budget's share no variant can use, per load level of the estimates (ServingOverhead).
        est = self.settings.estimates
        self.overhead = ServingOverhead(mode=self.settings.correction.overhead, memory_s=est.memory_s,
                                        levels=est.load_buckets if self.settings.correction.overhead_by_load else 1)
        self._overhead_level: int | None = None  # the load level the last decision read the overhead at
        self.overhead_ms = 0.0
        self.shadow = ShadowRuns(self.pool, self.estimator, self.settings, self.stats, self.state_lock,
                                 self._known_ids, fixed=self.fixed_variant is not None, now_s=self.now_s)
        self.shadow.optimizer = self.optimizer  # the neighbours it keeps fresh at any load

    def attach_routes(self, provider: Any) -> JointPath:
        """Decide variant, offload cut and codec, and the adapted copy in one pass: ``provider`` (the
        offload device; None: no peer, local routes only) supplies the cut costs and the link; it
        no longer decides itself."""
        adapt_bytes = self.adapt.adapted_bytes() if self.adapt is not None else None
        precisions = {v.arch_id: str(v.extra.get("precision", "fp32")) for v in self.bundle.spec.variants}
        self.joint = JointPath(self.optimizer, provider, adapt_bytes=adapt_bytes, precisions=precisions,
                               fixed_variant=self.fixed_variant, score_margin=self.settings.switch.score_margin)
        if self.adapt is not None:
            self.adapt.fits = self._adapted_fits
        return self.joint

    def _adapted_fits(self, base: str) -> bool:
        """Whether the adapted copy of ``base`` fits the memory budget beside it (the adapt gene's memory)."""
        limit = self.effective_budgets.memory_bytes
        extra = self.adapt.adapted_bytes().get(base) if self.adapt is not None else None
        return limit is None or extra is None or self.optimizer.variant(base).memory_bytes + extra <= limit

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        runner = self._active
        return runner is not None and runner.warm

    @property
    def active_runner(self) -> Runner | None:
        return self._active

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
        if self.fixed_variant is None:
            order = self.pool.preload_order(self._active.arch_id)
            self.pool.preload([a for a in order if a not in self.loads.failed], self.capacity_bytes())
            # The engine each preloaded variant really runs on: its prior takes that engine's r.
            # (Without this a variant never run kept the bundle's preferred engine, whose r nothing
            # measured under serve --engine tvm: its prior was the ORT profile's 0.6 ms for a
            # variant TVM runs in 40.)
            for arch_id in self.pool.loaded_ids():
                runner = self.pool.get(arch_id)
                if runner is not None and arch_id in self._known_ids:
                    self.estimator.set_engine(arch_id, runner.engine)
        if background:
            self.loop.start()
            if self.adapt is not None:
                self.adapt.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.loop.stop()
        if self.adapt is not None:
            self.adapt.stop(timeout_s)
        if self.research is not None:
            self.research.stop(timeout_s)
        self.loop.join(timeout_s)
        self.loads.wait_refill(timeout_s)
        self.monitor.stop()

    def request_tick(self) -> bool:
        """Ask the control thread for a decision soon (:meth:`ControlThread.request`)."""
        return self.loop.request()

    # -- shadow runs (hmt.serve.running.shadow) ------------------------------------------------

    def _shadow_wanted(self) -> bool:
        return self.shadow.wanted(self.active_arch_id, self.load.recent_max)

    def shadow_run(self) -> bool:
        """One shadow run of a stale, loaded, idle variant when no request is in flight; whether it ran."""
        if self.shadow.inflight:
            return False
        ran, error = self.shadow.run(self.active_arch_id, self.load.now, self.load_scale, self.load.recent_max)
        if error is not None:
            self.last_error = error
        return ran

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

    @property
    def effective_budgets(self) -> Budgets:
        """The budgets the loop decides with: the memory budget cut to the free memory above the reserve."""
        return self.free_memory.cap(self.budgets)

    def capacity_bytes(self) -> int | None:
        limits = [m for m in (self.settings.preload_memory_mb, self.effective_budgets.memory_mb) if m is not None]
        return int(min(limits) * 1e6) if limits else None

    # -- the decision ------------------------------------------------------------------------

    def tick(self, trigger: str = TRIGGER_ON_DEMAND, sample: ResourceSample | None = None) -> TickRecord:
        """One pass of the loop; serialised (concurrent callers wait for each other)."""
        with self._tick_lock:
            return self._tick(trigger, sample)

    def _estimate(self, load_next: float, load_now: float, latency_limit_ms: float,
                  budgets: Budgets, stay_slack_ms: float = 0.0) -> tuple[int, ...]:
        """The estimate stage of a tick (timed as ``estimate_us``): file the samples since the last
        tick under the load measured over them, refresh the estimates (kept up to date on each
        measurement, so this re-reads only what changed) and reduce them to the feasible set
        (:meth:`DecisionPath.feasible`). The decision is at the forecast ``load_next``, with what
        the variants measured at ``load_now`` as a floor (a step shows in the requests first).
        ``stay_slack_ms``: how much more of the budget the active variant may use to stay than
        another to be moved to (the serving overhead's bounds, :meth:`ServingOverhead.limits_ms`). Every
        variant but the active one is judged at the request rate it would serve: one that could not keep
        up on these cores queues (:mod:`hmt.serve.deciding.keep_up`)."""
        estimator = self.estimator
        now_s = self.now_s()
        with self.state_lock:
            estimator.refile(load_now, now_s)
            self._measured_count = estimator.refresh(now_s)
            rate_per_s = self.request_rate.per_s(now_s)
        latencies, ratios = estimator.latencies(1.0 + self.optimizer.alpha_latency * load_next, load_next, load_now,
                                                self.switcher.active_arch_id)
        active = self.switcher.active_arch_id
        if stay_slack_ms > 0 and active is not None and active in self._known_ids:
            i = self.optimizer.position(active)
            latencies = latencies.copy()
            latencies[i] = max(0.0, latencies[i] - stay_slack_ms)
        latencies = at_own_load(latencies, rate_per_s, self.cores,
                                self.optimizer.position(active) if active is not None and active in self._known_ids
                                else -1)
        joint = self.joint
        if joint is not None:
            self.decision.inputs = (latencies, ratios, 1.0 + self.optimizer.alpha_latency * load_next)
            adopted = self.adapt.adopted_base if self.adapt is not None else None
            return joint.feasible(latencies, ratios, load_next, latency_limit_ms, budgets, adopted, estimator.newest_s)
        return self.decision.feasible(latencies, ratios, load_next, latency_limit_ms, budgets, estimator.newest_s)

    def _latency_limit_ms(self, budgets: Budgets, level: int | None = None) -> tuple[float, float]:
        """(compute share of the latency budget a variant is moved to within, serving overhead):
        :class:`ServingOverhead` at load ``level`` (None: the last decision's)."""
        level = self._overhead_level if level is None else level
        with self.state_lock:  # the request threads append to its windows (record)
            move_ms, _, overhead_ms = self.overhead.decision_limits_ms(budgets.latency_ms, self.settings.correction,
                                                                       level)
        return move_ms, overhead_ms

    def _limits(self, load_now: float, load_next: float, budgets: Budgets) -> tuple[float, float]:
        """(compute limit to move to a variant, how much more the active one may use to stay): the
        requests since the last tick are filed under the load it just measured, the decision reads
        the overhead at its forecast's level."""
        level = self._overhead_level = self.estimator.level_of(load_next)
        # Under the state lock: the request threads append to the overhead's windows (record), and a
        # list or sort of a deque another thread appends to can raise "deque mutated during iteration"
        # (a garbage collection inside it lets another thread run); that once ended the control thread.
        with self.state_lock:
            self.overhead.settle(self.estimator.level_of(load_now), self.now_s())
            move_ms, stay_ms, self.overhead_ms = self.overhead.decision_limits_ms(budgets.latency_ms,
                                                                                  self.settings.correction, level)
        return move_ms, (stay_ms - move_ms if math.isfinite(move_ms) else 0.0)

    def _tick(self, trigger: str, sample: ResourceSample | None) -> TickRecord:
        self.loop.last_tick_s = self._clock()
        if sample is None:
            sample = self.monitor.sample_now()
        load_now, load_next, own = self.load.update(sample)
        load_next = round(load_next / LOAD_STEP) * LOAD_STEP  # the load index bucket
        self.free_memory.update(self.now_s(), sample, self.pool.loaded_bytes())
        budgets = self.effective_budgets
        latency_limit_ms, stay_slack_ms = self._limits(load_now, load_next, budgets)
        self.shadow.limit_ms = latency_limit_ms  # a slower neighbour is measured under load only with room for it
        miss_streak = self.settings.switch.miss_streak
        confirmed = miss_streak > 0 and self._miss_streak >= miss_streak
        # mu from the battery reading, like the load index from the CPU reading: an input of the
        # decision, derived from the sample before it.
        mu = self.decision.mu(sample)
        self.shadow.mu = mu  # the climb target the shadow runs keep fresh scores with it
        e0 = time.perf_counter()
        mask = self._estimate(load_next, load_now, latency_limit_ms, budgets, stay_slack_ms)
        e1 = time.perf_counter()
        cpu0 = time.thread_time_ns()  # outside the wall-time span: the call itself costs a few us
        t0 = time.perf_counter()
        switcher = self.switcher
        if self.joint is not None:
            choice = self.joint.choose(mask, mu, switcher.active_arch_id, switcher.home)  # type: ignore[arg-type]
        else:
            choice = self.decision.choose(mask, mu, switcher.active_arch_id, switcher.home)  # type: ignore[arg-type]
        result = switcher.offer(choice, confirmed=confirmed)  # the switcher reads our clock if it needs it
        t1 = time.perf_counter()
        decision_cpu_us = (time.thread_time_ns() - cpu0) / 1e3
        decision_us = (t1 - t0) * 1e6
        estimate_us = (e1 - e0) * 1e6
        measured = self._measured_count
        load_scale = self.decision.inputs[2]
        decision = self.decision.record(choice, load_next, latency_limit_ms, mu, budgets)
        with self.state_lock:
            self.stats.decision_us.append(decision_us)
            self.stats.infeasible_ticks += not decision.feasible
        for observe in self.decision_observers:
            observe(decision_us / 1e6)
        if result.switched:
            self._miss_streak = 0  # the streak was the old variant's
        self.load_scale = load_scale
        self.last_decision = decision
        error = self._apply(result)
        active = self._active.arch_id if self._active is not None else result.active_arch_id
        self._settle(active)
        if error is not None:
            self.last_error = error
        elif result.switched or trigger == TRIGGER_INITIAL:
            self.last_error = None  # a stale error must not outlive the state it described
        estimates = {e.arch_id: e for e in self.estimator.estimates(self.now_s(), load_scale, load_next)}
        active_estimate = estimates[active]
        if self.research is not None:
            measured = active_estimate.source != "prior"
            self.research.offer(decision.feasible, measured, active, latency_limit_ms, budgets.memory_bytes,
                                decision.reason, active_estimate.latency_ms if measured else None)
        record = TickRecord(
            time_s=self.now_s(), trigger=trigger, cpu_util=sample.cpu_util, mem_util=sample.mem_util,
            gpu_util=sample.gpu_util, battery_percent=sample.battery_percent, temperature_c=sample.temperature_c,
            load_index=load_now, load_forecast=load_next,
            latency_ratio=active_estimate.ratio if active_estimate.ratio is not None else 1.0,
            overhead_ms=self.overhead_ms, mu=decision.mu,
            latency_budget_ms=budgets.latency_ms, memory_budget_mb=budgets.memory_mb,
            proposed=decision.arch_id, active=active, switched=result.switched and error is None,
            switch_reason=result.reason, feasible=decision.feasible,
            predicted_latency_ms=active_estimate.latency_ms, decision_us=decision_us,
            decision_cpu_us=decision_cpu_us, error=error, own_cpu_util=own,
            estimate_source=active_estimate.source, measured_variants=measured, energy_budget=budgets.energy,
            estimate_us=estimate_us,
        )
        with self.state_lock:
            self.ticks.append(record)
        if result.reason == STAY_VIOLATION_PENDING:
            # Patience counts decisions: ask for the next one soon rather than a period later.
            self.loop.pending = True
        if self._on_tick is not None:
            self._on_tick(record)
        return record

    def _settle(self, active: str) -> None:
        """After a decision: the active variant's route (joint decision), and the pool trimmed to the
        memory budget, keeping the active variant and the adopted adapted copy's base."""
        if self.joint is not None:  # the active variant's route, read by the request path
            self.route = self.joint.route_of(active)
            # A local route runs the adapted copy as soon as one is adopted (before the next decision names it:
            # same latency and energy as its variant, and adoption already checked its memory); a cut never does.
            self.use_adapted = self.route is None or self.route[0].cut is None
        adopted = self.adapt.adopted_arch_id if self.adapt is not None else None
        evicted = self.pool.trim(self.capacity_bytes(), keep={active} if adopted is None else {active, adopted})
        self.loads.dropped.update(evicted)
        if evicted:
            if self.on_evicted is not None:
                self.on_evicted(evicted)
        elif self.loads.dropped or self.loads.refilling:  # a memory cut lifted: load back what it unloaded
            for runner in self.loads.refill_async(self.pool.preload_order(active), self.capacity_bytes()):
                self.estimator.set_engine(runner.arch_id, runner.engine)

    def _apply(self, result: Any) -> str | None:
        """Load the switcher's choice if it is not the active runner; a failure reverts the switch."""
        if not (result.switched or self._active is None or self._active.arch_id != result.active_arch_id):
            return None
        try:
            runner = self.loads.load(result.active_arch_id)
        except ModelError as exc:
            self.stats.load_failures += 1
            if result.switched:
                self.switcher.revert(result)
            if self._active is None:
                self._fallback_initial(result.active_arch_id)
            return str(exc)
        self._active = runner
        self.estimator.set_engine(runner.arch_id, runner.engine)
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
        (or, for a share of requests, a faster one not measured lately: :meth:`ShadowRuns.probe`)."""
        base = self.serving_runner()
        probe = self.shadow.probe(base, self.optimizer) if base.arch_id in self._known_ids else None
        # serve --adapt: the adapted variant of the active one, when the guard adopted it.
        runner = probe if probe is not None else base if self.adapt is None or not self.use_adapted \
            else self.adapt.runner_for(base)
        early = self.settings.early_exit
        with self.shadow.serving():
            result = runner.run(x, early.confidence if early.enabled else None)
        if self.adapt is not None and probe is None:
            self.adapt.offer(x)  # a non-blocking put: adaptation runs on its own thread
        return self.record(runner, base if probe is None else probe, x, result, queued_ms)

    def serving_runner(self) -> Runner:
        """The runner answering requests now; DeviceError before the first variant is warm."""
        base = self._active
        if base is None or not base.warm:
            raise DeviceError("no variant is loaded and warm yet")
        return base

    def record(self, runner: Runner, measured: Runner, x: np.ndarray, result: ChainResult,
               queued_ms: float) -> Prediction:
        """File one answered input: ``measured`` is the bundled variant its compute time counts for."""
        self.shadow.last_input = x
        latency_ms = queued_ms + result.compute_ms
        budget_ms = self.budgets.latency_ms
        miss = budget_ms is not None and latency_ms > budget_ms
        predicted_ms = runner.variant.latency_ms * self.load_scale * result.predicted_share
        now_s = self.now_s()
        with self.state_lock:
            # The estimates are per bundled variant: an adapted one's time counts for its base.
            self.estimator.observe(measured.arch_id, result.compute_ms, predicted_ms, now_s, self.load.now)
            self.overhead.add(queued_ms, result.compute_ms if runner is self._active else None, now_s)
            self.stats.add_request(latency_ms, miss, result.exit, runner.arch_id)
            self.request_rate.add(now_s)
        if runner is self._active:
            self._miss_streak = self._miss_streak + 1 if miss else 0
        if miss:
            self.request_tick()
        return Prediction(result.class_index, result.confidence, result.exit, runner.arch_id, result.compute_ms,
                          latency_ms, miss, result.probabilities)

    # -- reporting -------------------------------------------------------------------------------

    def status(self, last: int = 10) -> dict[str, Any]:
        """What ``/v1/status`` shows (:func:`hmt.serve.reporting.status.controller_status`)."""
        return controller_status(self, last)
