"""The device side of offloading: plan, run the head, send, and finish locally when the peer fails.

:class:`OffloadDevice` holds the variants it may run as :class:`SplitChain` s (so it can run
all of a variant, or any head, or any tail as a fallback), a :class:`PeerClient`, a
:class:`LinkEstimator`, a :class:`CircuitBreaker` and the :class:`OffloadPlanner`. Under
``hmt serve --peer`` the serve controller decides (:mod:`hmt.serve.deciding.joint`): the device
supplies its costs and conditions (``route_costs``, ``route_conditions``), loads and releases
variants as the controller's pool does (``load_variant``, ``drop_variant``) and answers with
``run(x, option)``; the planner decides only for the standalone device (``predict``).

``predict(x)`` / ``run(x, option)``:
1. ask the planner (variant, cut) under the current link, peer load and device slowdown
   (``run``: the option serve chose);
2. run the head; an early exit on the device answers without sending anything;
3. send the tensor with a time limit: the deadline minus what the device needs to finish
   the tail itself (measured warm time x slowdown, + a margin). When that leaves less
   than the predicted round trip, the peer gets the whole remaining time instead (the
   local fallback could not make the deadline either);
4. on any failure (refused, reset, timeout, 4xx/5xx) the breaker opens and the tail runs
   here: the request is answered, late at worst, never failed.

A prober thread keeps the estimates alive: while the breaker is open it retries the peer
at the breaker's backoff; when the link has been idle it sends a status request (RTT,
peer load, the peer's tail times) and a small upload (bytes over time). While requests
go to the peer, the device's own slowdown is re-measured with local runs every
``local_refresh_s`` so that a device that got faster again is noticed.

Accounting (:mod:`hmt.offload.timing`): every exchange with the peer is split into the
device's own time (its thread's CPU and wait for its core), the peer's (``server_ms`` in its
answer) and the rest, which alone feeds the link estimate. The device's slowdown scales
its compute (local variants, heads, encoding); its exchange time is planned at its own
recent tail; the peer's part scales with the peer's reported slowdown and queue.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.bundle import Bundle
from hmt.errors import UsageError
from hmt.offload.breaker import CLOSED, CircuitBreaker
from hmt.offload.client import PeerClient, PeerFailure, Reply, check_answer, peer_times_ms, read_status
from hmt.offload.codec import CODECS, codec_times_ms, encode
from hmt.offload.link import LinkEstimator
from hmt.offload.parts import Answer, SplitChain
from hmt.offload.plan import OffloadPlan
from hmt.offload.planner import Choice, Conditions, CutCost, OffloadPlanner, Option, PlannerConfig, VariantCost
from hmt.offload.timing import RecentTail
from hmt.serve.deciding.joint import CutRoute, RouteConditions, VariantRoutes

WHERE_LOCAL = "local"
WHERE_DEVICE_EXIT = "device_exit"
WHERE_PEER = "peer"
WHERE_FALLBACK = "fallback"
# Without a latency budget, the peer is waited for at most max(this, twice its predicted time, the
# local tail's time): a silent peer then costs a request at most about twice what running locally
# would, instead of most of the request's deadline (1.8 s of 2 s) on every retry of the breaker.
PEER_WAIT_FLOOR_MS = 50.0


@dataclass(frozen=True)
class DeviceOptions:
    budget_ms: float  # the latency target the planner plans for and the per-request deadline
    confidence: float | None = None  # early exit threshold; None: off
    margin_ms: float = 1.0  # kept back for the local fallback's own jitter
    probe_interval_s: float = 0.2
    # Probes cost the device CPU on the request path's core; on a quota-limited device a probe
    # can push the next request into a throttled period. These rates measured best on the bench.
    idle_probe_s: float = 2.0
    probe_bytes: int = 8192
    status_every_s: float = 1.0
    local_refresh_s: float = 1.0
    remote_window_s: float = 10.0
    ratio_smoothing: float = 0.3
    # The device's slowdown is planned at this quantile of its runs of the last device_window_s:
    # a busy or throttled core slows some runs 50x and others not at all, and the budget is a tail.
    device_window_s: float = 3.0
    device_quantile: float = 0.9
    mu: float = 1.0
    fixed_cut: int | None = None  # baselines: always this cut of the first/fixed variant (-1: all local)
    fixed_variant: str | None = None
    # False: budget_ms is a share of the request's deadline, not a latency budget the user set. The
    # peer's wait is then also bounded by what finishing here would take (see PEER_WAIT_FLOOR_MS).
    budget_given: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget_ms) and self.budget_ms > 0):
            raise UsageError(f"offload budget must be a finite number > 0 ms, got {self.budget_ms}")
        if self.confidence is not None and not 0 < self.confidence <= 1:
            raise UsageError(f"exit confidence must be in (0, 1], got {self.confidence}")


@dataclass(frozen=True)
class OffloadResult:
    class_index: int
    confidence: float
    exit: int
    variant: str
    cut: int | None
    codec: str
    where: str
    latency_ms: float
    deadline_miss: bool
    peer_error: str | None = None
    probabilities: np.ndarray | None = None  # of the answering exit (float32); None: the peer sent none


class OffloadDevice:
    def __init__(self, bundle: Bundle, plan: OffloadPlan, client: PeerClient, options: DeviceOptions, *,
                 planner_config: PlannerConfig | None = None, rng: np.random.Generator,
                 clock: Callable[[], float] = time.monotonic, threads: int | None = 1, warmup_runs: int = 5,
                 engine: str = "auto", only: Collection[str] | None = None) -> None:
        self.bundle = bundle
        self.client = client
        self.options = options
        self.clock = clock
        self.rng = rng
        self.link = LinkEstimator(clock)
        self.breaker = CircuitBreaker(clock, rng)
        x = rng.standard_normal(bundle.spec.input.shape).astype(np.float32)
        self._sample = x
        self._plan, self._threads, self._engine, self._warmup_runs = plan, threads, engine, warmup_runs
        # Replaced, never changed in place (load_variant, drop_variant): a request reads one dict.
        self.chains: dict[str, SplitChain] = {}
        for variant in bundle.spec.variants:
            if options.fixed_variant is not None and variant.arch_id != options.fixed_variant:
                continue
            if only is not None and variant.arch_id not in only:
                continue  # serve's decision keeps it out (over the memory budget): not loaded at all
            chain = SplitChain(bundle, variant, plan.for_variant(variant.arch_id), threads, engine)
            chain.warm_up(x, warmup_runs)
            self.chains[variant.arch_id] = chain
        if not self.chains:
            raise UsageError(f"--variant {options.fixed_variant!r} is not in the bundle" if only is None else
                             "no variant of the bundle fits the memory budget on the device")
        self._codec_ms = {(a, c.index): codec_times_ms(c.tensor.shape, rng) for a, ch in self.chains.items()
                          for c in ch.cuts}
        self.peer_tail_ms: dict[str, list[float]] = {}
        self.planner_config = planner_config if planner_config is not None else PlannerConfig()
        self.cost_version = 0
        self._routes: tuple[int, dict[str, VariantRoutes]] | None = None
        self.planner = self._new_planner()
        self.mu = options.mu  # eq. 3's accuracy weight; the serve loop updates it from the battery
        self.device_ratio_mean = 1.0  # smoothed, reported; planning takes the recent tail
        self._device_runs = RecentTail(clock, window_s=options.device_window_s, quantile=options.device_quantile)
        self._exchanges = RecentTail(clock, window_s=options.remote_window_s, quantile=options.device_quantile)
        self._exchange_ms = 0.5  # the device's own time in one exchange, until measured
        self.peer_ratio = 1.0
        self.peer_queue_ms = 0.0
        self._last_local_s = -math.inf
        self._last_transfer_s = -math.inf
        self._last_status_s = -math.inf
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.history: deque[dict[str, Any]] = deque(maxlen=256)
        # (time, observed / predicted remote time) of recent offloaded requests
        self._remote_ratios: deque[tuple[float, float]] = deque(maxlen=30)
        self.last_choice: Choice | None = None
        # Called when the peer becomes unusable or usable again (serve: ask its decision loop for a new route).
        self.on_peer_change: Callable[[], object] | None = None

    # -- planning ------------------------------------------------------------------------------

    def _new_planner(self) -> OffloadPlanner:
        variants = []
        for arch_id, chain in self.chains.items():
            v = chain.variant
            peer = self.peer_tail_ms.get(arch_id)
            cuts = []
            for c in chain.cuts:
                if self.options.fixed_cut is not None and c.index != self.options.fixed_cut:
                    continue
                # Until the peer reports its own tail times, assume it is as fast as this device.
                peer_ms = peer[c.index] if peer is not None and c.index < len(peer) else chain.tail_time_ms(c)
                cuts.append(CutCost(c.index, chain.device_ms(c), peer_ms,
                                    {codec: c.size_bytes(codec) for codec in CODECS},
                                    self._codec_ms[(arch_id, c.index)]))
            if self.options.fixed_cut is not None and self.options.fixed_cut >= 0 and not cuts:
                raise UsageError(f"variant {arch_id!r} has no cut {self.options.fixed_cut}")
            variants.append(VariantCost(arch_id, v.accuracy, v.energy, chain.device_ms(None), tuple(cuts)))
        self.costs = tuple(variants)
        self.cost_version += 1
        planner = OffloadPlanner(variants, self.planner_config, self.clock)
        old = getattr(self, "planner", None)
        if old is not None:
            planner.current, planner.since_s, planner.switches = old.current, old.since_s, old.switches
        return planner

    def load_variant(self, arch_id: str) -> SplitChain:
        """Load and warm one more variant (serve's pool asks when its decision chose one not loaded)."""
        chain = self.chains.get(arch_id)
        if chain is not None:
            return chain
        chain = SplitChain(self.bundle, self.bundle.spec.variant(arch_id), self._plan.for_variant(arch_id),
                           self._threads, self._engine)
        chain.warm_up(self._sample, self._warmup_runs)
        codec_ms = {(arch_id, c.index): codec_times_ms(c.tensor.shape, self.rng) for c in chain.cuts}
        with self._lock:
            self._codec_ms.update(codec_ms)
            self.chains = {**self.chains, arch_id: chain}
            self.planner = self._new_planner()
        return chain

    def drop_variant(self, arch_id: str) -> bool:
        """Release a variant's sessions (serve's pool evicted it under the memory budget); the last stays."""
        with self._lock:
            if arch_id not in self.chains or len(self.chains) == 1:
                return False
            self.chains = {a: c for a, c in self.chains.items() if a != arch_id}
            self.planner = self._new_planner()
        return True

    def conditions(self) -> Conditions:
        usable = self.breaker.state == CLOSED
        return Conditions(link=self.link.estimate() if usable else None, budget_ms=self.options.budget_ms,
                          device_ratio=self.device_ratio, peer_ratio=self.peer_ratio,
                          peer_queue_ms=self.peer_queue_ms, mu=self.mu, exchange_ms=self.exchange_ms,
                          remote_factor=self.remote_factor())

    # -- serve's joint decision (hmt.serve.deciding.joint): the device supplies costs, it does not decide

    def route_costs(self) -> tuple[int, dict[str, VariantRoutes]]:
        """(version, variant -> its warm local time and every cut in every codec), from the same costs
        the standalone planner scores; a new version when the peer's reported tail times change."""
        with self._lock:
            version, costs = self.cost_version, self.costs
        cached = self._routes
        if cached is not None and cached[0] == version:
            return cached
        codecs = self.planner_config.codecs
        routes = {v.arch_id: VariantRoutes(v.local_ms, tuple(
            CutRoute(c.index, codec, c.device_ms, c.codec_ms.get(codec, 0.0), c.peer_ms, c.bytes_by_codec[codec])
            for c in v.cuts for codec in codecs)) for v in costs}
        self._routes = (version, routes)
        return self._routes

    def route_conditions(self) -> RouteConditions:
        """The link, the peer and this device now; ``rtt_ms=None`` while the breaker is not closed."""
        if self.breaker.state != CLOSED:
            return RouteConditions(device_ratio=self.device_ratio, radio_mj_per_kb=self.planner_config.radio_mj_per_kb)
        link = self.link.estimate()
        return RouteConditions(link.rtt_ms, link.ms_per_byte, self.device_ratio, self.peer_ratio, self.peer_queue_ms,
                               self.exchange_ms, self.remote_factor(), self.planner_config.radio_mj_per_kb)

    @property
    def device_ratio(self) -> float:
        """Measured / warm compute time on this device at a recent tail (the mean until enough runs)."""
        return self._device_runs.value(self.device_ratio_mean)

    @property
    def exchange_ms(self) -> float:
        """The device's own time in one exchange with the peer, at a recent tail."""
        return self._exchanges.value(self._exchange_ms)

    def observe_exchange(self, device_ms: float) -> None:
        """The device's own time (CPU + wait for its core) in one exchange with the peer."""
        if math.isfinite(device_ms) and device_ms >= 0:
            self._exchanges.add(device_ms)
            self._exchange_ms = device_ms

    def remote_factor(self) -> float:
        """The 90th percentile of observed / predicted remote time over the requests offloaded in the
        last ``remote_window_s`` (1 below 5 of them: after a while local, the peer is tried again)."""
        since = self.clock() - self.options.remote_window_s
        ratios = [r for t, r in list(self._remote_ratios) if t >= since]
        return 1.0 if len(ratios) < 5 else max(1.0, float(np.percentile(ratios, 90)))

    def choose(self) -> Choice:
        with self._lock:
            if self.options.fixed_cut is not None and self.options.fixed_cut < 0:
                conditions = Conditions(link=None, budget_ms=self.options.budget_ms, device_ratio=self.device_ratio,
                                        mu=self.mu)
            else:
                conditions = self.conditions()
            choice = self.planner.decide(conditions)
            self.last_choice = choice
            return choice

    def observe_device_run(self, measured_ms: float, warm_ms: float) -> None:
        """A compute run on this device that took ``measured_ms`` against ``warm_ms`` warm."""
        if warm_ms <= 0 or not math.isfinite(measured_ms):
            return
        # Up to 200x: a 1 ms graph on a core throttled by a CPU quota and a busy neighbour
        # measured 70-110 ms at its 95th percentile (benchmarks/offload/results/shipped_bundle.json).
        sample = min(200.0, max(0.2, measured_ms / warm_ms))
        self._device_runs.add(sample)
        with self._lock:
            self.device_ratio_mean += self.options.ratio_smoothing * (sample - self.device_ratio_mean)
            self._last_local_s = self.clock()

    # -- a request ----------------------------------------------------------------------------

    def predict(self, x: np.ndarray) -> OffloadResult:
        """Plan with the standalone planner, then :meth:`run` (the offload benchmarks' device)."""
        start = time.perf_counter()
        return self.run(x, self.choose().option, start)

    def run(self, x: np.ndarray, option: Option, start: float | None = None, spent_ms: float = 0.0) -> OffloadResult:
        """Answer ``x`` as ``option`` says (serve's joint decision chose it): the head here, the tail on
        the peer, and the tail here when the peer fails; ``spent_ms`` of the budget went before
        (serve: the request's queue and decoding), so the peer gets what is left of it."""
        if start is None:
            start = time.perf_counter()
        chain = self.chains.get(option.arch_id)
        if chain is None:  # dropped since the route was chosen: the variant serve runs now answers
            chain = next(iter(self.chains.values()))
            option = Option(chain.arch_id, None, "-", option.predicted_ms, option.energy, option.score, False)
        confidence = self.options.confidence
        budget = self.options.budget_ms
        if option.cut is None:
            answer = chain.run_local(x, confidence)
            if answer.exit == chain.last:
                self.observe_device_run(answer.compute_ms, chain.device_ms(None))
            return self._result(answer, option, WHERE_LOCAL, start)
        cut = chain.cut(option.cut)
        head = chain.run_head(x, cut, confidence)
        head_ms = (time.perf_counter() - start) * 1e3
        if isinstance(head, Answer):
            return self._result(head, option, WHERE_DEVICE_EXIT, start)
        if cut.device_segments:
            self.observe_device_run(head_ms, chain.device_ms(cut))
        local_rest_ms = chain.tail_time_ms(cut) * self.device_ratio + self.options.margin_ms
        left_ms = budget - spent_ms - head_ms
        predicted_remote = option.predicted_ms - chain.device_ms(cut) * self.device_ratio
        limit_ms = left_ms - local_rest_ms
        if limit_ms < predicted_remote:
            # The fallback cannot make the deadline either: the peer may take as long as the fallback
            # would (up to twice its prediction), since a late local answer is no better than a late
            # peer answer. On a busy device the local tail is the longer one (bench: 84 vs 55 ms).
            limit_ms = max(left_ms, predicted_remote, min(local_rest_ms, 2 * predicted_remote))
        if not self.options.budget_given:
            limit_ms = min(limit_ms, max(PEER_WAIT_FLOOR_MS, 2 * predicted_remote, local_rest_ms))
        error = None
        if self.breaker.allow():
            encoded = encode(head, option.codec)
            try:
                reply = self.client.segment(chain.arch_id, cut.index, encoded.body, encoded.headers,
                                            confidence=confidence, limit_ms=limit_ms,
                                            graphs_sha256=chain.graphs_sha256)
                body = reply.body
                got, got_confidence, got_exit, got_probabilities = check_answer(body, self.bundle.spec.classes,
                                                                                chain.last + 1)
                answer = Answer(got, got_confidence, got_exit, 0.0, got_probabilities)
                remote_ms = self._observe_reply(chain, cut.index, len(encoded.body), reply, body)
                self._success()
                if option.remote_ms > 0:
                    with self._lock:
                        self._remote_ratios.append((self.clock(), min(20.0, remote_ms / option.remote_ms)))
                return self._result(answer, option, WHERE_PEER, start)
            except (PeerFailure, KeyError, TypeError, ValueError) as exc:
                error = exc.reason if isinstance(exc, PeerFailure) else "bad_reply"
                self.errors[error] += 1
                self._failure(str(exc) if isinstance(exc, PeerFailure) else error)
        answer = chain.run_tail(head, cut, confidence)
        return self._result(answer, option, WHERE_FALLBACK, start, peer_error=error or "breaker_open")

    def _observe_reply(self, chain: SplitChain, index: int, size: int, reply: Reply, body: dict[str, Any]) -> float:
        """Split the round trip (device, peer, link; see the module docstring); returns link + peer ms."""
        peer_ms, compute_ms, queue_ms = peer_times_ms(body, reply.elapsed_ms)
        device_ms = reply.device.wall_ms(self.device_ratio)
        network_ms = max(0.0, reply.elapsed_ms - device_ms - peer_ms)
        self.link.observe_transfer(size, network_ms)
        self.observe_exchange(device_ms)
        with self._lock:
            self._last_transfer_s = self.clock()
            self.peer_queue_ms += 0.3 * (queue_ms - self.peer_queue_ms)
            warm = self.peer_tail_ms.get(chain.arch_id)
            if warm is not None and int(body.get("exit", -1)) == chain.last and warm[index] > 0:
                sample = min(20.0, max(0.2, compute_ms / warm[index]))
                self.peer_ratio += self.options.ratio_smoothing * (sample - self.peer_ratio)
        return network_ms + peer_ms

    def _result(self, answer: Answer, option: Option, where: str, start: float, *,
                peer_error: str | None = None) -> OffloadResult:
        latency_ms = (time.perf_counter() - start) * 1e3
        self.counts[where] += 1
        return OffloadResult(answer.class_index, answer.confidence, answer.exit, option.arch_id, option.cut,
                             option.codec, where, latency_ms, latency_ms > self.options.budget_ms, peer_error,
                             answer.probabilities)

    # -- probing ------------------------------------------------------------------------------

    def refresh_peer_status(self, limit_ms: float = 500.0) -> bool:
        """GET the peer's status: RTT, load, tail times. False (and the breaker told) when it fails."""
        try:
            reply = self.client.status(limit_ms)
            tails, ratio = read_status(reply.body, {a: ch.graphs_sha256 for a, ch in self.chains.items()})
        except PeerFailure as exc:
            self.errors[f"probe_{exc.reason}"] += 1
            self._failure(f"probe: {exc}")
            return False
        device_ms = reply.device.wall_ms(self.device_ratio)
        self.link.observe_rtt(max(0.0, reply.elapsed_ms - device_ms))
        self.observe_exchange(device_ms)
        with self._lock:
            self._last_status_s = self.clock()
            self.peer_ratio = ratio if ratio is not None else self.peer_ratio
            if tails != self.peer_tail_ms:
                self.peer_tail_ms = tails
                self.planner = self._new_planner()
        self._success()
        return True

    def _failure(self, reason: str) -> None:
        """The breaker counts a failure; ``reason`` (the failure with its detail: a refused
        certificate, the peer's error text) is what /v1/status shows as ``last_error``."""
        was = self.breaker.state
        self.breaker.failure(reason[:300])
        if was == CLOSED and self.breaker.state != CLOSED and self.on_peer_change is not None:
            self.on_peer_change()

    def _success(self) -> None:
        was = self.breaker.state
        self.breaker.success()
        if was != CLOSED and self.on_peer_change is not None:
            self.on_peer_change()

    def probe_bandwidth(self, limit_ms: float = 1000.0) -> bool:
        try:
            reply = self.client.probe(self.options.probe_bytes, limit_ms)
        except PeerFailure as exc:
            self.errors[f"probe_{exc.reason}"] += 1
            self._failure(f"probe: {exc}")
            return False
        device_ms = reply.device.wall_ms(self.device_ratio)
        self.link.observe_transfer(self.options.probe_bytes, max(0.0, reply.elapsed_ms - device_ms))
        self.observe_exchange(device_ms)
        with self._lock:
            self._last_transfer_s = self.clock()
        return True

    def probe_once(self) -> None:
        now = self.clock()
        if self.breaker.state != CLOSED:
            if self.breaker.allow():
                self.refresh_peer_status()
            return
        if now - self._last_status_s >= self.options.status_every_s and not self.refresh_peer_status():
            return
        if now - self._last_transfer_s >= self.options.idle_probe_s:
            self.probe_bandwidth()
        if now - self._last_local_s >= self.options.local_refresh_s:
            self.refresh_device_ratio()

    def refresh_device_ratio(self) -> None:
        """One local run of the current variant off the request path: is this device slower or faster now?"""
        choice = self.last_choice
        chain = self.chains[choice.option.arch_id] if choice is not None else next(iter(self.chains.values()))
        # Two runs, both count: the planner takes a tail of the recent runs, and a device whose
        # requests all go to the peer gets only these (the first after a quiet spell may run on
        # cold caches: a CLI device measured r = 9.7 from one cold run at start-up, hence two).
        for _ in range(2):
            self.observe_device_run(chain.run_local(self._sample, None).compute_ms, chain.device_ms(None))

    def start(self) -> None:
        self.refresh_peer_status()

        def loop() -> None:
            while not self._stop.wait(self.options.probe_interval_s):
                self.probe_once()

        self._prober = threading.Thread(target=loop, name="hmt-offload-probe", daemon=True)
        self._prober.start()

    def stop(self) -> None:
        self._stop.set()
        if self._prober is not None:
            self._prober.join(5.0)
        self.client.close()

    def status(self) -> dict[str, Any]:
        link = self.link.estimate()
        choice = self.last_choice
        return {
            "peer": self.client.url,
            "breaker": self.breaker.snapshot(),
            "link": {"rtt_ms": link.rtt_ms, "bandwidth_mbit_s": link.bandwidth_mbit_s, "samples": link.samples,
                     "age_s": link.age_s},
            "device_ratio": self.device_ratio, "device_ratio_mean": self.device_ratio_mean,
            "exchange_ms": self.exchange_ms, "peer_ratio": self.peer_ratio, "peer_queue_ms": self.peer_queue_ms,
            "remote_factor": self.remote_factor(),
            "choice": None if choice is None else {"option": choice.option.label, "best": choice.best.label,
                                                   "reason": choice.reason,
                                                   "predicted_ms": choice.option.predicted_ms},
            "switches": self.planner.switches,
            "answered": dict(self.counts), "peer_errors": dict(self.errors),
        }
