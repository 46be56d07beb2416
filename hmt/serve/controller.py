"""The on-device adaptation loop: monitor -> load index -> corrected costs -> eq. 3 -> switch.

One :class:`Controller` per served bundle. Its control thread takes a resource sample
every ``monitor_period_s`` (and on demand: a request over its latency budget, a budget
change, or a pending budget violation asks for a decision at most every
``on_demand_min_interval_s``), computes the load index (AdaScale eq. 2) and its AR
forecast for the next period, scales every candidate's profiled latency by the forecast
load and by ``r = measured / predicted`` of the running variant (AdaptiveNet 5.3),
chooses by CrowdHMTware eq. 3 and offers the choice to the hysteresis switcher. A switch
to a variant that is not loaded loads it on the control thread while the old one keeps
serving; a failed load is reverted and the old variant stays.

Requests call :meth:`Controller.predict` from any thread: it reads the active runner
(one reference, swapped atomically), runs the chain with early exit, and feeds the
measured time back into ``r``. ``r`` compares like with like: a request that left at an
early exit is compared with the share of the full chain's warm-up time it spent.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from hmt.bundle import Bundle
from hmt.errors import DeviceError, HmtError, ModelError, UsageError
from hmt.runtime.chain import Runner
from hmt.serve.load_index import LoadForecaster, load_index_of
from hmt.serve.monitor import ResourceMonitor, ResourceSample, Sampler
from hmt.serve.optimizer import Budgets, Decision, LatencyCorrector, Optimizer, Variant
from hmt.serve.pool import Loader, VariantPool
from hmt.serve.settings import BudgetSettings, ServeSettings
from hmt.serve.switcher import STAY_VIOLATION_PENDING, Switcher

TRIGGER_INITIAL = "initial"
TRIGGER_PERIODIC = "periodic"
TRIGGER_ON_DEMAND = "on_demand"
_HISTORY = 2048
# A variant that failed to load is not tried again for this long (each try costs a load).
LOAD_RETRY_S = 30.0


@dataclass(frozen=True)
class TickRecord:
    """One decision of the loop, as the timeline and ``/v1/status`` show it."""

    time_s: float  # since the controller started
    trigger: str
    cpu_util: float
    mem_util: float
    gpu_util: float | None
    battery_percent: float | None
    temperature_c: float | None
    load_index: float
    load_forecast: float
    latency_ratio: float
    overhead_ms: float
    mu: float
    latency_budget_ms: float | None
    memory_budget_mb: float | None
    proposed: str
    active: str
    switched: bool
    switch_reason: str
    feasible: bool
    predicted_latency_ms: float  # of the active variant, load-scaled and r-corrected
    decision_us: float  # wall time of optimizer + switcher (includes waiting for the GIL)
    decision_cpu_us: float  # this thread's CPU time for the same work: the decision's own cost
    error: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prediction:
    class_index: int
    confidence: float
    exit: int
    variant: str
    compute_ms: float
    latency_ms: float  # queue wait + compute
    deadline_miss: bool


@dataclass
class _Stats:
    requests: int = 0
    deadline_misses: int = 0
    per_exit: Counter[int] = field(default_factory=Counter)
    per_variant: Counter[str] = field(default_factory=Counter)
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=_HISTORY))
    decision_us: deque[float] = field(default_factory=lambda: deque(maxlen=_HISTORY))
    latency_sum_ms: float = 0.0
    load_failures: int = 0


def variants_of(bundle: Bundle) -> list[Variant]:
    """The optimizer's table: each bundled variant at its own exit."""
    return [Variant(v.arch_id, v.accuracy, v.latency_ms, v.energy, int(v.memory_mb * 1e6))
            for v in bundle.spec.variants]


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
    ) -> None:
        self.bundle = bundle
        self.settings = settings if settings is not None else ServeSettings.from_mapping(bundle.serve_config)
        self.engine = engine if engine is not None else self.settings.engine
        self._clock = clock
        self.t0_s = clock()  # the controller's time zero on ``clock``
        self.optimizer = Optimizer(variants_of(bundle), self.settings.optimizer)
        if fixed_variant is not None:
            self.optimizer.variant(fixed_variant)  # unknown id: UsageError naming it
        self.fixed_variant = fixed_variant
        self.switcher = Switcher(self.settings.switch, clock=clock)
        c = self.settings.correction
        self.corrector = LatencyCorrector(c.smoothing, c.r_min, c.r_max)
        self.forecaster = LoadForecaster(order=2, window=60)
        self._recent_load: deque[float] = deque(maxlen=5)
        self.monitor = ResourceMonitor(sampler, frequency_hz=1.0 / self.settings.monitor_period_s)
        self.pool = VariantPool(bundle, engine=self.engine, threads=threads, warmup_runs=warmup_runs, loader=loader,
                                early_exit=self.settings.early_exit.enabled)
        self.budgets: BudgetSettings = self.settings.budgets
        self._active: Runner | None = None
        self._load_scale = 1.0  # (1 + alpha * I) of the last decision, without r
        self._state_lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_tick_s = -math.inf
        self._pending = False  # an on-demand decision was asked for
        self._on_tick = on_tick
        self.ticks: deque[TickRecord] = deque(maxlen=256)
        self.stats = _Stats()
        self.last_error: str | None = None
        self._failed_loads: dict[str, float] = {}
        self.overhead_ms = 0.0  # smoothed queue wait per request (the budget's share the model cannot use)

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
        if background:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="hmt-serve-controller", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
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
            self._wake.wait(max(0.0, wait_s))
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

    # -- budgets ---------------------------------------------------------------------------

    def set_budgets(self, latency_ms: float | None, memory_mb: float | None) -> None:
        """Replace the run-time budgets (``None``: unconstrained) and ask for a decision."""
        new = BudgetSettings(latency_ms=latency_ms, memory_mb=memory_mb, energy=self.budgets.energy)
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

    def _tick(self, trigger: str, sample: ResourceSample | None) -> TickRecord:
        self._last_tick_s = self._clock()
        if sample is None:
            sample = self.monitor.sample_now()
        load_now = load_index_of(sample, self.settings.load_weights)
        self.forecaster.update(load_now)
        recent = self._recent_load
        recent.append(load_now)
        # An AR fit over a step-like window can overshoot wildly (we saw 1.0 and 0.0 forecast
        # right after a step from 0.02 to 0.27): keep its smoothing, not its extrapolation.
        load_next = min(max(recent), max(min(recent), float(self.forecaster.forecast(1)[0])))
        budgets = self.budgets
        opt_budgets = budgets.to_budgets()
        overhead_ms = self.overhead_ms
        if opt_budgets.latency_ms is not None:
            # The budget covers queue wait + compute; the variants' costs are compute alone, so
            # they get what the serving overhead measured now leaves of it (times the headroom).
            compute_ms = self.settings.correction.headroom * opt_budgets.latency_ms - overhead_ms
            opt_budgets = replace(opt_budgets, latency_ms=max(1e-3, compute_ms))
        active_id = self.switcher.active_arch_id
        ratio = self.corrector.ratio
        t0 = time.perf_counter()
        cpu0 = time.thread_time_ns()
        decision = self.optimizer.decide(load_next, sample.battery_percent, sample.battery_plugged, opt_budgets,
                                         ratio, active_id)
        if self.fixed_variant is not None:
            decision = self._fixed(decision, load_next, ratio, opt_budgets)
        result = self.switcher.offer(decision, now_s=self._clock())
        decision_us = (time.perf_counter() - t0) * 1e6
        decision_cpu_us = (time.thread_time_ns() - cpu0) / 1e3
        with self._state_lock:
            self.stats.decision_us.append(decision_us)
        self._load_scale = self.optimizer.latency_scale(load_next)
        error: str | None = None
        if result.switched or self._active is None or self._active.arch_id != result.active_arch_id:
            try:
                failed_at = self._failed_loads.get(result.active_arch_id)
                if failed_at is not None and self._clock() - failed_at < LOAD_RETRY_S:
                    raise ModelError(f"variant {result.active_arch_id!r} failed to load "
                                     f"{self._clock() - failed_at:.1f} s ago; retrying after {LOAD_RETRY_S:g} s")
                runner = self.pool.load(result.active_arch_id)
            except ModelError as exc:
                error = str(exc)
                self.stats.load_failures += 1
                if failed_at is None or self._clock() - failed_at >= LOAD_RETRY_S:  # a real try, not a skip
                    self._failed_loads[result.active_arch_id] = self._clock()
                if result.switched:
                    self.switcher.revert(result)
                if self._active is None:
                    self._fallback_initial(result.active_arch_id)
            else:
                # r carries over to the new variant (AdaptiveNet: the ratio reflects the device now).
                self._active = runner
                self._failed_loads.pop(result.active_arch_id, None)
        active = self._active.arch_id if self._active is not None else result.active_arch_id
        self.pool.trim(self._capacity_bytes(), keep={active})
        if error is not None:
            self.last_error = error
        active_variant = self.optimizer.variant(active)
        record = TickRecord(
            time_s=self.now_s(), trigger=trigger, cpu_util=sample.cpu_util, mem_util=sample.mem_util,
            gpu_util=sample.gpu_util, battery_percent=sample.battery_percent, temperature_c=sample.temperature_c,
            load_index=load_now, load_forecast=load_next, latency_ratio=ratio, overhead_ms=overhead_ms,
            mu=decision.mu,
            latency_budget_ms=budgets.latency_ms, memory_budget_mb=budgets.memory_mb,
            proposed=decision.arch_id, active=active, switched=result.switched and error is None,
            switch_reason=result.reason, feasible=decision.feasible,
            predicted_latency_ms=active_variant.latency_ms * decision.latency_scale,
            decision_us=decision_us, decision_cpu_us=decision_cpu_us, error=error,
        )
        with self._state_lock:
            self.ticks.append(record)
        if result.reason == STAY_VIOLATION_PENDING:
            # Patience counts decisions: ask for the next one soon rather than a period later.
            self._pending = True
        if self._on_tick is not None:
            self._on_tick(record)
        return record

    def _fixed(self, decision: Decision, load: float, ratio: float, budgets: Budgets) -> Decision:
        """A static baseline: the decision is always the fixed variant (scored for the record)."""
        fixed = self.optimizer.variant(self.fixed_variant or "")
        scale = self.optimizer.latency_scale(load, ratio)
        feasible = (budgets.latency_ms is None or fixed.latency_ms * scale <= budgets.latency_ms) and (
            budgets.memory_bytes is None or fixed.memory_bytes <= budgets.memory_bytes)
        return replace(decision, arch_id=fixed.arch_id, feasible=feasible,
                       predicted_latency_ms=fixed.latency_ms * scale, memory_bytes=fixed.memory_bytes,
                       score=decision.current_score or 0.0)

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
        """Answer one input (already validated to the bundle's input spec) with the active variant."""
        runner = self._active
        if runner is None or not runner.warm:
            raise DeviceError("no variant is loaded and warm yet")
        early = self.settings.early_exit
        result = runner.run(x, early.confidence if early.enabled else None)
        latency_ms = queued_ms + result.compute_ms
        budget_ms = self.budgets.latency_ms
        miss = budget_ms is not None and latency_ms > budget_ms
        predicted_ms = runner.variant.latency_ms * self._load_scale * result.predicted_share
        with self._state_lock:
            if predicted_ms > 0:
                with contextlib.suppress(UsageError):
                    self.corrector.update(result.compute_ms, predicted_ms)
            self.overhead_ms += self.corrector.smoothing * (max(0.0, queued_ms) - self.overhead_ms)
            stats = self.stats
            stats.requests += 1
            stats.deadline_misses += miss
            stats.per_exit[result.exit] += 1
            stats.per_variant[runner.arch_id] += 1
            stats.latency_ms.append(latency_ms)
            stats.latency_sum_ms += latency_ms
        if miss:
            self.request_tick()
        return Prediction(result.class_index, result.confidence, result.exit, runner.arch_id, result.compute_ms,
                          latency_ms, miss)

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
        latest = ticks[-1] if ticks else None
        capacity = self._capacity_bytes()
        return {
            "ready": self.ready,
            "variant": self.active_arch_id,
            "engine": self._active.engine if self._active is not None else None,
            "fixed_variant": self.fixed_variant,
            "uptime_s": self.now_s(),
            "load_index": None if latest is None else latest.load_index,
            "load_forecast": None if latest is None else latest.load_forecast,
            "latency_ratio": self.corrector.ratio,
            "overhead_ms": self.overhead_ms,
            "mu": None if latest is None else latest.mu,
            "budgets": {"latency_ms": self.budgets.latency_ms, "memory_mb": self.budgets.memory_mb},
            "early_exit": asdict(self.settings.early_exit),
            "pool": {"loaded": self.pool.loaded_ids(), "loaded_mb": self.pool.loaded_bytes() / 1e6,
                     "capacity_mb": None if capacity is None else capacity / 1e6,
                     "loads": self.pool.load_count, "load_failures": self.pool.load_failures,
                     "evictions": self.pool.evictions},
            "switches": self.switcher.switch_count,
            "requests": requests,
            "deadline_misses": misses,
            "per_exit": per_exit,
            "per_variant": per_variant,
            "latency_ms": None if lat is None else {"p50": float(np.percentile(lat, 50)),
                                                     "p95": float(np.percentile(lat, 95))},
            "decision_us_p50": None if dec is None else float(np.median(dec)),
            "last_error": self.last_error,
            "last_decisions": [t.to_json_dict() for t in ticks[-last:]],
        }
