"""Recovery after a load step and the climb back after it (issue 14: "the first 0.5 s window after
each step with at most 5% misses comes within 0.5 s"; "accuracy within 3 points of the unloaded
choice"). The loop on a fake engine whose compute times are scripted (so the tests do not depend
on how busy the machine is): big takes 5 ms idle and 14 ms under load, small 2 / 4 ms; the
budget is 9 ms; the load model (alpha 0.2) says big still fits under load (5 x 1.2 = 6 ms)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import CLASSES, VariantDef, make_bundle

from hmt.bundle import load_bundle
from hmt.runtime.chain import ChainResult, ChainRunner
from hmt.runtime.settings import EstimatorSettings, ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.deciding.estimates import SOURCE_MEASURED, LatencyEstimator
from hmt.serve.deciding.monitor import ResourceSample

X = np.zeros((1, 4), dtype=np.float32)
COMPUTE_MS = {"big": (5.0, 14.0), "small": (2.0, 4.0)}  # (idle, loaded)


def sample(cpu: float) -> ResourceSample:
    return ResourceSample(time.monotonic(), cpu, 8_000_000_000, 8_000_000_000)


class Loop:
    """A controller on the fake engine with its own clock; ``request`` serves one input, and asks
    for a decision after a miss as the running loop does (on-demand tick)."""

    def __init__(self, tmp_path: Path, variants: tuple[VariantDef, ...] | None = None,
                 compute_ms: dict[str, tuple[float, float]] | None = None, alpha: float = 0.2,
                 **estimates: float) -> None:
        if variants is None:
            variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("small", 0.80, 1.0, 1.0))
        times = COMPUTE_MS if compute_ms is None else compute_ms
        bundle = load_bundle(make_bundle(tmp_path / "b", variants))
        settings = ServeSettings.from_mapping({
            "budgets": {"latency_ms": 9.0}, "optimizer": {"alpha_latency": alpha},
            "switch": {"min_dwell_s": 1.0, "violation_patience": 2, "improve_patience": 2, "miss_streak": 3},
            "estimates": {"shadow_share": 0.0, **estimates}})
        self.now = 0.0
        self.high = False
        self.cpu = 0.0
        loop = self

        class FakeTimeRunner(ChainRunner):
            def run(self, x: np.ndarray, confidence: float | None) -> ChainResult:
                ms = times[self.arch_id][loop.high]
                loop.now += ms / 1e3
                return replace(super().run(x, confidence), compute_ms=ms)

        def load(arch_id: str) -> ChainRunner:
            def head(x: np.ndarray) -> np.ndarray:
                return x.reshape(1, -1)[:, :CLASSES] @ np.eye(CLASSES, dtype=np.float32)

            return FakeTimeRunner(bundle.spec.variant(arch_id), [lambda x: x] * 2, [head] * 2, "tvm")

        self.c = Controller(bundle, settings, sampler=lambda: sample(self.cpu), loader=load, warmup_runs=1,
                            clock=lambda: self.now)
        self.c.start(background=False)

    def tick(self) -> str:
        return self.c.tick(sample=sample(self.cpu)).active

    def request(self) -> tuple[str, bool]:
        p = self.c.predict(X)
        self.now += 0.05  # 20 requests/s
        if p.deadline_miss:
            self.tick()  # the on-demand decision a miss asks for
        return p.variant, p.deadline_miss

    def idle(self, seconds: float) -> None:
        """Requests at 20/s with a periodic tick every 0.25 s."""
        end = self.now + seconds
        while self.now < end:
            for _ in range(5):
                self.request()
            self.tick()


def test_a_step_the_load_model_underestimates_is_left_after_two_slow_requests(tmp_path: Path) -> None:
    """Idle, big serves at 5 ms. The load steps to 1.0 and big takes 14 ms, which the load model
    (5 ms x 1.2) does not see. The loop must leave big after at most 3 slow requests (two at the
    new load are the floor of its estimate there, the third confirms the misses): with the
    forecast lagging the step and min_samples (5) needed at a level before its p95 counted,
    the code before served 5 or more."""
    loop = Loop(tmp_path)
    loop.idle(2.0)
    assert loop.c.active_arch_id == "big"
    loop.high, loop.cpu = True, 1.0
    served = [loop.request() for _ in range(8)]
    on_big = [m for a, m in served if a == "big"]
    assert len(on_big) <= 3, served
    assert served[-1][0] == "small"
    estimate = loop.c.status()["estimates"]["big"]
    assert estimate["latency_ms"] >= 14.0 and estimate["source"] in ("measured_few", SOURCE_MEASURED)


def test_a_step_is_left_when_the_load_index_jumps_between_levels(tmp_path: Path) -> None:
    """Right after a step on a 2-core machine the outside load index read at each tick jumps
    between levels (0.3, 0.55, 0.8 here: serve's own CPU share, subtracted, moves with the
    requests in the tick's interval), so no level holds two of the slow requests. Two of big's
    last three requests over the budget still floor its estimate: it is left after at most 3."""
    loop = Loop(tmp_path)
    loop.idle(2.0)
    assert loop.c.active_arch_id == "big"
    loop.high = True
    served = []
    for k in range(8):
        loop.cpu = (0.3, 0.55, 0.8)[k % 3]
        served.append(loop.request())
    assert len([a for a, _ in served if a == "big"]) <= 3, served
    assert served[-1][0] == "small"


def test_single_slow_requests_at_idle_never_switch(tmp_path: Path) -> None:
    """No oscillation from the floor: one slow request in every 40 at idle (a scheduler hiccup;
    at 20 requests/s a 1.5 s window holds one), each with a load spike in the tick after it,
    does not move the loop off big: one sample at a level is no floor, and two at the busy
    level (40 requests apart) make one violating decision, not the two the patience asks for."""
    loop = Loop(tmp_path)
    loop.idle(1.5)
    switches = loop.c.switcher.switch_count
    for k in range(160):
        loop.high = k % 40 == 7
        loop.cpu = 1.0 if loop.high else 0.0
        loop.request()
        loop.high = False
        if k % 5 == 4 or loop.cpu:
            loop.tick()
            loop.cpu = 0.0
    assert loop.c.active_arch_id == "big"
    assert loop.c.switcher.switch_count == switches


def test_the_loop_climbs_back_after_the_load_lifts(tmp_path: Path) -> None:
    """The step's first slow requests run before any tick has measured the load; filed under the
    idle level, two of them among big's ~30 idle samples set its idle p95 at 14 ms, so after the
    load phase big looked too slow at idle for the whole memory (30 s) and the loop stayed on
    small (the accuracy lost under load). Moved to the level the next tick measured, they leave
    big's idle window as it was: the loop climbs back within about a dwell of the load lifting."""
    loop = Loop(tmp_path)
    loop.idle(2.0)
    assert loop.c.active_arch_id == "big"
    loop.high = True  # the step: the burners start ...
    loop.c.predict(X)  # ... and two requests run before a tick has measured it
    loop.now += 0.05
    loop.c.predict(X)
    loop.now += 0.05
    loop.cpu = 1.0
    loop.idle(2.0)
    assert loop.c.active_arch_id == "small"
    loop.high, loop.cpu = False, 0.0  # the load lifts
    actives = []
    while loop.now < 2.0 + 2.0 + 2.5 + 2.5:
        loop.idle(0.25)
        actives.append(loop.c.active_arch_id)
    assert actives[-1] == "big", actives
    assert actives.index("big") <= 8, actives  # within 2 s (dwell 1 s + patience + the forecast)
    est = loop.c.status()["estimates"]["big"]
    assert est["latency_ms"] == pytest.approx(5.0)


def test_one_new_sample_does_not_empty_a_level_the_loop_comes_back_to() -> None:
    """A level keeps its last regime (30 samples at 5 ms) when the loop comes back to it after
    max_age_s: one new sample (a shadow run) joins them instead of pushing them out, so the level
    stays measured; min_samples new ones replace them."""
    est = LatencyEstimator(["big"], [1.0], ["tvm"], EstimatorSettings(), alpha_latency=0.2)
    t = 0.0
    for _ in range(30):
        est.observe("big", 5.0, 1.0, t, 0.0)
        t += 0.05
    est.observe("big", 20.0, 1.0, t, 1.0)  # elsewhere meanwhile: a busy level
    t += 10.0
    est.observe("big", 5.5, 1.0, t, 0.0)
    est.refresh(t)
    (latency,), _ = est.latencies(1.0, 0.0, active="big")  # big serves: the low side of its p95
    assert latency == pytest.approx(5.0)  # the p95 of the 31 (not 20 x 1.2 scaled from the busy level)
    assert est.estimates(t, 1.0, 0.0)[0].source == SOURCE_MEASURED
    for _ in range(5):
        t += 0.05
        est.observe("big", 7.0, 1.0, t, 0.0)
    est.refresh(t)
    (latency,), _ = est.latencies(1.0, 0.0)
    assert latency == pytest.approx(7.0)  # the old regime left once 5 new samples were there


def test_samples_move_to_the_level_the_next_tick_measured() -> None:
    """refile: samples taken since the last refile go to the level of the load given."""
    est = LatencyEstimator(["big"], [1.0], ["tvm"], EstimatorSettings(), alpha_latency=0.2)
    for k in range(6):
        est.observe("big", 5.0, 1.0, 0.05 * k, 0.0)
    assert est.refile(0.0, 0.3) == 0
    est.observe("big", 14.0, 1.0, 0.35, 0.0)
    est.observe("big", 14.0, 1.0, 0.40, 0.0)
    assert est.refile(1.0, 0.45) == 2
    est.refresh(0.45)
    (idle,), _ = est.latencies(1.0, 0.0)
    assert idle == pytest.approx(14.0)  # 2 of the last 3 samples, whatever their level
    est.refresh(2.5)  # ... only while they are recent
    (idle,), _ = est.latencies(1.0, 0.0)
    assert idle == pytest.approx(5.0)
    (loaded,), _ = est.latencies(1.2, 1.0)
    assert loaded == pytest.approx(14.0)  # the floor of the 2 samples at the busy level, over 5 x 1.2
    assert est.estimates(2.5, 1.2, 1.0)[0].source == "measured_few"


def test_the_loop_goes_back_home_after_a_violation_where_the_score_is_within_the_margin() -> None:
    """big is left on a violation. Later eq. 3 (mu 0.49: a falling battery) scores small 0.02 over
    big, less than the 0.05 margin: unloaded the switcher stays on big; after the load it must
    go back to big (the home) once big fits again, not stay on small. With small 0.2 over big
    (mu 0.4) it stays on small, as the unloaded loop would have moved there too. The code before
    stayed on small in both cases (below_margin)."""
    from hmt.runtime.settings import Budgets, SwitchPolicy
    from hmt.serve.deciding.costs import Variant
    from hmt.serve.deciding.decision import DecisionPath
    from hmt.serve.deciding.optimizer import Optimizer
    from hmt.serve.running.switcher import Switcher

    opt = Optimizer([Variant("big", 0.92, 8.0, 2.0, 1), Variant("small", 0.80, 2.0, 1.0, 1)])
    path = DecisionPath(opt)
    path.score_margin = 0.05  # the switcher's (set so, the test runs on the code before too)
    clock = [0.0]
    sw = Switcher(SwitchPolicy(min_dwell_s=1.0, improve_patience=2, violation_patience=1), clock=lambda: clock[0])
    budgets = Budgets(latency_ms=9.0)

    def offer(big_ms: float, mu: float) -> str:
        mask = path.feasible([2.0, big_ms], [1.0, 1.0], 0.0, 9.0, budgets)  # the table is by latency
        choice = path.choose(mask, mu, sw.active_arch_id, *([sw.home] if hasattr(sw, "home") else []))
        result = sw.offer(choice)
        clock[0] += 0.25
        return result.reason

    offer(8.0, 1.0)
    assert sw.active_arch_id == "big"
    offer(14.0, 1.0)  # the load: big does not fit
    assert sw.active_arch_id == "small"
    reasons = [offer(14.0, 0.49) for _ in range(8)]  # still loaded: small stays
    assert sw.active_arch_id == "small", reasons
    reasons = [offer(8.0, 0.49) for _ in range(8)]  # the load lifts; small scores 0.02 over big
    assert sw.active_arch_id == "big", reasons
    assert "back_to_home" in reasons
    # Home reached: forgotten. Below the margin now, big stays as the unloaded loop would.
    assert [offer(8.0, 0.49) for _ in range(4)][-1] == "below_margin"
    assert sw.active_arch_id == "big"
    # Left again on a violation, then small scores 0.2 over big: no way home.
    offer(14.0, 0.4)
    assert sw.active_arch_id == "small"
    reasons = [offer(8.0, 0.4) for _ in range(8)]
    assert sw.active_arch_id == "small", reasons


def test_a_climb_to_a_middle_variant_on_the_way_back_keeps_the_home() -> None:
    """big is left on a violation for small. When the load lifts, mid fits a tick before big does
    (a memory squeeze released, a queue draining), so the loop climbs to mid on score; big scores
    0.01 over mid, under the 0.05 margin. mid is part of the way back, not a choice over big: the
    loop must go on to big (home) once big fits. The code before forgot the home on the climb to
    mid and stayed there (below_margin: traced on TVM after a memory squeeze). A climb to a variant
    scoring at the home's level or above still forgets it."""
    from hmt.runtime.settings import Budgets, SwitchPolicy
    from hmt.serve.deciding.costs import Variant
    from hmt.serve.deciding.decision import DecisionPath
    from hmt.serve.deciding.optimizer import Optimizer
    from hmt.serve.running.switcher import Switcher

    opt = Optimizer([Variant("big", 0.91, 8.0, 2.0, 1), Variant("mid", 0.90, 5.0, 1.5, 1),
                     Variant("small", 0.60, 2.0, 1.0, 1)])
    path = DecisionPath(opt)
    path.score_margin = 0.05
    clock = [0.0]
    sw = Switcher(SwitchPolicy(min_dwell_s=1.0, improve_patience=2, violation_patience=1), clock=lambda: clock[0])
    budgets = Budgets(latency_ms=9.0)

    def offer(big_ms: float, mid_ms: float) -> str:
        mask = path.feasible([2.0, mid_ms, big_ms], [1.0, 1.0, 1.0], 0.0, 9.0, budgets)
        result = sw.offer(path.choose(mask, 1.0, sw.active_arch_id, sw.home))
        clock[0] += 0.25
        return result.reason

    offer(8.0, 5.0)
    assert sw.active_arch_id == "big"
    offer(20.0, 14.0)  # the load: neither big nor mid fits
    assert sw.active_arch_id == "small"
    reasons = [offer(20.0, 5.0) for _ in range(8)]  # mid fits again first
    assert sw.active_arch_id == "mid" and "better_by_margin" in reasons, reasons
    reasons = [offer(8.0, 5.0) for _ in range(8)]  # then big
    assert sw.active_arch_id == "big" and "back_to_home" in reasons, reasons
    # Left again (later than two dwell times: not a failed return), then a climb to big itself on
    # score: home reached, forgotten.
    clock[0] += 3.0
    offer(20.0, 14.0)
    assert sw.active_arch_id == "small" and sw.home == "big"
    [offer(8.0, 5.0) for _ in range(8)]
    assert sw.active_arch_id == "big" and sw.home is None


def test_a_way_home_that_fails_at_once_is_not_tried_again() -> None:
    """No oscillation from the home: on ONNX Runtime (ort3, 46fed66) a budget at the edge of the
    largest variant made the loop go home and fall back every 1.2 s (12 switches against 4
    unloaded). A return that violates within two dwell times forgets the home; the margin rules
    of the switcher apply again (small scores 0.02 over big: it stays)."""
    from hmt.runtime.settings import Budgets, SwitchPolicy
    from hmt.serve.deciding.costs import Variant
    from hmt.serve.deciding.decision import DecisionPath
    from hmt.serve.deciding.optimizer import Optimizer
    from hmt.serve.running.switcher import Switcher

    opt = Optimizer([Variant("big", 0.92, 8.0, 2.0, 1), Variant("small", 0.80, 2.0, 1.0, 1)])
    path = DecisionPath(opt)
    path.score_margin = 0.05
    clock = [0.0]
    sw = Switcher(SwitchPolicy(min_dwell_s=1.0, improve_patience=2, violation_patience=1), clock=lambda: clock[0])
    budgets = Budgets(latency_ms=9.0)

    def offer(big_ms: float, mu: float = 0.49) -> str:
        mask = path.feasible([2.0, big_ms], [1.0, 1.0], 0.0, 9.0, budgets)
        result = sw.offer(path.choose(mask, mu, sw.active_arch_id, *([sw.home] if hasattr(sw, "home") else [])))
        clock[0] += 0.25
        return result.reason

    offer(8.0, 1.0)
    offer(14.0)  # left on a violation
    reasons = [offer(8.0) for _ in range(8)]
    assert "back_to_home" in reasons and sw.active_arch_id == "big"
    offer(14.0)  # the way home failed at once
    assert sw.active_arch_id == "small"
    reasons = [offer(8.0) for _ in range(12)]
    assert sw.active_arch_id == "small" and "back_to_home" not in reasons, reasons


def test_a_share_of_requests_measures_a_faster_variant_never_run(tmp_path: Path) -> None:
    """big, mid and small; the profile says mid takes 0.95 of big, the engine runs it at 0.4 (2 /
    6 ms idle / loaded, big 5 / 14 ms). The loop serves big and runs neither mid nor small (no
    shadow runs: the workers are busy). When the load makes big too slow, mid's prior (the
    profile x the load model x the engine's r learnt on big) is over the 9 ms budget, and with no
    measurement of mid the loop goes to small. One request in 20 served by the nearest faster
    variant not measured lately gives mid a measurement at idle, its prior its own ratio, and
    the loop goes to mid (2 points of top-1 off big, not 32). (The code before also priced mid
    with the r of the bundle's preferred engine, which nothing ran: its prior was the profile's.)"""
    variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("mid", 0.90, 1.9, 1.5),
                VariantDef("small", 0.60, 1.0, 1.0))
    times = {"big": (5.0, 14.0), "mid": (2.0, 6.0), "small": (1.0, 3.0)}
    loop = Loop(tmp_path, variants, times, alpha=1.0)
    loop.idle(3.0)
    assert loop.c.active_arch_id == "big"
    per_variant = loop.c.status()["per_variant"]
    assert 1 <= per_variant.get("mid", 0) <= 3 and per_variant.get("small", 0) <= 3, per_variant
    loop.high, loop.cpu = True, 1.0
    for _ in range(10):
        loop.request()
    assert loop.c.active_arch_id == "mid", loop.c.status()["estimates"]


def test_preloaded_variants_are_priced_with_the_engine_they_run_on(tmp_path: Path) -> None:
    """The runners are TVM, the bundle prefers ONNX Runtime: after start every preloaded variant's
    prior takes the r measured on TVM, not the r of an engine nothing ran (1: the profile's own
    prediction, 2.5x low here)."""
    loop = Loop(tmp_path, probe_share=0.0)
    assert set(loop.c.estimator.engines) == {"tvm"}
    loop.idle(1.0)
    small = loop.c.status()["estimates"]["small"]
    assert small["source"] == "prior" and small["latency_ms"] >= 2.0  # 1.0 ms x r (2.5)


def test_the_floor_over_a_time_span_needs_half_its_samples_slow() -> None:
    """estimates.floor_span_s (the ablation for fast engines): the floor is the lower median of the
    variant's samples in the last span, so two slow requests among ten in 0.1 s set no floor,
    six of ten do; with the default (0) the last 3 decide."""
    def floor(span_s: float, slow: set[int]) -> float:
        est = LatencyEstimator(["big"], [1.0], ["tvm"], EstimatorSettings(floor_span_s=span_s), alpha_latency=0.2)
        for k in range(10):
            est.observe("big", 14.0 if k in slow else 5.0, 1.0, 0.01 * k, 0.0)
        est.refresh(0.1)
        return est._last_floor[0]

    assert floor(0.2, {8, 9}) == 5.0
    assert floor(0.2, {4, 5, 6, 7, 8, 9}) == 14.0
    assert floor(0.0, {8, 9}) == 14.0
