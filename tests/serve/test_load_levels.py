"""Per-load-level latency estimates (issue 14 item 1): a variant not run recently is judged on
what it measured at a similar load, not on a prior from an unloaded period."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import CLASSES, VariantDef, make_bundle

from hmt.bundle import load_bundle
from hmt.errors import UsageError
from hmt.runtime.chain import ChainResult, ChainRunner
from hmt.runtime.settings import EstimatorSettings, ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.deciding.estimates import SOURCE_MEASURED, SOURCE_PRIOR, SOURCE_SCALED, LatencyEstimator
from hmt.serve.deciding.monitor import ResourceSample

X = np.zeros((1, 4), dtype=np.float32)

# The profile predicts big 1.0 ms and small 0.5 ms; the engine runs them 5-20x slower.
IDS = ["big", "small"]


def sample(cpu: float = 0.0) -> ResourceSample:
    return ResourceSample(time.monotonic(), cpu, 8_000_000_000, 8_000_000_000)
PREDICTED_MS = [1.0, 0.5]


def estimator(**settings: float) -> LatencyEstimator:
    return LatencyEstimator(IDS, PREDICTED_MS, ["tvm", "tvm"], EstimatorSettings(**settings),  # type: ignore[arg-type]
                            alpha_latency=1.0)


def run(est: LatencyEstimator, arch_id: str, ms: float, load: float, start_s: float, n: int = 20) -> float:
    """``n`` requests of ``arch_id`` taking ``ms`` at outside load ``load``, 50 ms apart; returns the end time."""
    t = start_s
    for _ in range(n):
        est.observe(arch_id, ms, PREDICTED_MS[IDS.index(arch_id)] * (1 + load), t, load)
        t += 0.05
    return t


def decide(est: LatencyEstimator, load: float, now_s: float) -> dict[str, tuple[float, str]]:
    est.refresh(now_s)
    latencies, _ = est.latencies(1.0 + est.alpha_latency * load, load)
    sources = {e.arch_id: e.source for e in est.estimates(now_s, 1.0 + est.alpha_latency * load, load)}
    return {a: (latencies[i], sources[a]) for i, a in enumerate(IDS)}


def test_a_variant_slow_at_high_load_is_judged_on_that_when_the_load_returns() -> None:
    """big measured 20 ms at load 1.0, then the load fell and big ran at 5 ms; small served the
    next high-load period. When the load is high again, 3 s later (twice ``max_age_s``), big's
    estimate is its 20 ms from the last high-load period, not a prior that looks feasible; at low
    load its 5 ms are used."""
    est = estimator()
    t = run(est, "big", 20.0, 1.0, 0.0)  # high load: big too slow, the loop moves to small
    t = run(est, "small", 6.0, 1.0, t)
    t = run(est, "big", 5.0, 0.0, t + 0.5)  # load lifts: big back, fast
    t = run(est, "small", 6.0, 1.0, t + 3.0)  # high load again, small active since
    high = decide(est, 1.0, t)
    assert high["big"][1] == SOURCE_MEASURED
    assert high["big"][0] == pytest.approx(20.0)  # not the prior (1.0 ms x 2 x r x tail) nor the 5 ms
    assert high["small"] == (pytest.approx(6.0), SOURCE_MEASURED)
    low = decide(est, 0.0, t)
    assert low["big"] == (pytest.approx(5.0), SOURCE_MEASURED)


def test_without_levels_the_same_history_falls_back_to_the_prior() -> None:
    """The same history with one level (the behaviour before): big's slow samples are displaced
    by its fast ones at low load, so the high-load decision sees 5 ms; the levels are what keep
    the 20 ms."""
    est = estimator(load_buckets=1)
    t = run(est, "big", 20.0, 1.0, 0.0)
    t = run(est, "small", 6.0, 1.0, t)
    t = run(est, "big", 5.0, 0.0, t + 0.5)
    t = run(est, "small", 6.0, 1.0, t + 3.0)
    assert decide(est, 1.0, t)["big"][0] < 20.0


def test_an_empty_level_is_scaled_from_the_nearest_by_the_load_model() -> None:
    """big measured only unloaded (8 ms at load 0): at load 1.0 with alpha 1 its estimate is
    8 x (1 + 1.0) / (1 + 0) = 16 ms, marked scaled; small, never measured, is a prior."""
    est = estimator()
    t = run(est, "big", 8.0, 0.0, 0.0)
    high = decide(est, 1.0, t)
    assert high["big"] == (pytest.approx(16.0), SOURCE_SCALED)
    assert high["small"][1] == SOURCE_PRIOR
    # The nearest level wins: measured at 0.5 (12 ms) too, load 1.0 scales that one: 12 x 2 / 1.5.
    t = run(est, "big", 12.0, 0.5, t)
    assert decide(est, 1.0, t)["big"] == (pytest.approx(16.0), SOURCE_SCALED)
    assert decide(est, 0.75, t)["big"] == (pytest.approx(12.0 * 1.75 / 1.5), SOURCE_SCALED)


def test_within_a_level_old_samples_age_out_against_the_newest_and_memory_forgets() -> None:
    """Within a level the newest samples displace those more than ``max_age_s`` older (the level's
    state now); samples older than ``memory_s`` are forgotten: the prior again."""
    est = estimator(max_age_s=1.0, memory_s=10.0)
    t = run(est, "big", 20.0, 1.0, 0.0)
    t = run(est, "big", 10.0, 1.0, t + 5.0)
    assert decide(est, 1.0, t)["big"] == (pytest.approx(10.0), SOURCE_MEASURED)
    assert decide(est, 1.0, t + 11.0)["big"][1] == SOURCE_PRIOR


def test_stale_reads_the_current_level() -> None:
    """Shadow runs go to variants without fresh samples at the load the loop is at."""
    est = estimator()
    t = run(est, "big", 5.0, 0.0, 0.0)
    decide(est, 0.0, t)
    assert not est.stale("big", t)
    decide(est, 1.0, t)
    assert est.stale("big", t)


def test_load_levels_are_centred_and_bounded() -> None:
    est = estimator()
    assert [est.level_of(x) for x in (0.0, 0.12, 0.13, 0.49, 0.51, 0.9, 1.0, 3.0, -1.0)] == [0, 0, 1, 2, 2, 4, 4, 4, 0]
    with pytest.raises(UsageError, match="load_buckets"):
        EstimatorSettings(load_buckets=0)
    with pytest.raises(UsageError, match="memory_s"):
        EstimatorSettings(max_age_s=2.0, memory_s=1.0)


def test_the_loop_does_not_go_back_to_a_variant_that_was_slow_at_this_load(tmp_path: Path) -> None:
    """The loop, end to end on a fake engine whose big variant slows 7x under load and small 3x
    (so the engine's r, learnt on small, makes big's prior look feasible): after big missed at
    high load, ran fast at low load, and 3 s passed (twice ``max_age_s``), the load returns high.
    The loop leaves big at once on its high-load measurements (14 ms against a 7.2 ms compute
    limit) and stays on small; with the old per-variant windows big's measurements have aged out
    and its prior (~6 ms) keeps it."""
    variants = (VariantDef("big", 0.92, 2.0, 2.0), VariantDef("small", 0.80, 1.0, 1.0))
    bundle = load_bundle(make_bundle(tmp_path / "b", variants))
    settings = ServeSettings.from_mapping({"budgets": {"latency_ms": 9.0}, "switch": {
        "min_dwell_s": 0.0, "violation_patience": 1, "improve_patience": 1, "miss_streak": 3},
        "estimates": {"shadow_share": 0.0}})
    now = [0.0]
    state = {"high": False}
    slow_ms = {"big": (2.0, 14.0), "small": (1.0, 3.0)}

    class FakeTimeRunner(ChainRunner):
        """Reports the scripted compute time (not the wall time: this test must not depend on how
        busy the machine is) and moves the loop's clock by it."""

        def run(self, x: np.ndarray, confidence: float | None) -> ChainResult:
            ms = slow_ms[self.arch_id][state["high"]]
            now[0] += ms / 1e3
            return replace(super().run(x, confidence), compute_ms=ms)

    def load(arch_id: str) -> ChainRunner:
        def head(x: np.ndarray) -> np.ndarray:
            return x.reshape(1, -1)[:, :CLASSES] @ np.eye(CLASSES, dtype=np.float32)

        return FakeTimeRunner(bundle.spec.variant(arch_id), [lambda x: x] * 2, [head] * 2, "tvm")

    c = Controller(bundle, settings, sampler=sample, loader=load, warmup_runs=1, clock=lambda: now[0])
    c.start(background=False)

    def serve(n: int, cpu: float) -> str:
        state["high"] = cpu > 0.5
        for _ in range(5):
            c.tick(sample=sample(cpu))  # the load forecast settles on the load
            now[0] += 0.05
        for _ in range(n):
            c.predict(X)
            now[0] += 0.01
        rec = c.tick(sample=sample(cpu))
        return rec.active

    assert serve(8, 0.0) == "big"
    assert serve(8, 1.0) == "small"  # big missed at high load
    now[0] += 2.0  # past max_age_s: the old per-variant window would have forgotten big's misses here too
    assert serve(8, 0.0) == "big"  # back at low load on its low-load measurements
    now[0] += 3.0
    state["high"] = True
    actives = [c.tick(sample=sample(1.0)).active for _ in range(6)]
    assert actives[-1] == "small" and "big" not in actives[1:], actives
    estimate = c.status()["estimates"]["big"]
    assert estimate["source"] == "measured" and estimate["latency_ms"] == pytest.approx(14.0, rel=0.05)



def test_a_smaller_variant_scaled_from_idle_is_not_judged_slower_than_a_bigger_one_measured_now() -> None:
    """small measured 3 ms idle (mostly serving overhead, which the load does not scale), then big
    served the busy period at 4 ms. At load 1.0 the load model scales small to 3 x 2 = 6 ms, slower
    than big measures there; small's estimate is capped at big's 4 ms (still marked scaled), so a
    loop with nothing feasible does not judge big the faster and stay on it."""
    est = estimator()
    t = run(est, "small", 3.0, 0.0, 0.0)
    t = run(est, "big", 4.0, 1.0, t)
    high = decide(est, 1.0, t)
    assert high["big"] == (pytest.approx(4.0), SOURCE_MEASURED)
    assert high["small"] == (pytest.approx(4.0), SOURCE_SCALED)  # not 6.0
    assert decide(est, 0.0, t)["small"] == (pytest.approx(3.0), SOURCE_MEASURED)  # its own level: untouched


def test_where_the_two_bounds_disagree_the_higher_estimate_wins() -> None:
    """Three variants by the profile: tiny < mid < top. tiny measured 9 ms at load 1.0, top 5 ms
    there (noise, or a profile that orders them wrong); mid, only measured idle, is capped by top
    (5 ms) and bounded below by tiny (9 ms): the cautious bound, 9 ms, wins."""
    ids, predicted = ["top", "mid", "tiny"], [1.0, 0.6, 0.3]
    est = LatencyEstimator(ids, predicted, ["tvm"] * 3, EstimatorSettings(), alpha_latency=1.0)
    t = 0.0
    for arch, ms, load in (("mid", 2.0, 0.0), ("tiny", 9.0, 1.0), ("top", 5.0, 1.0)):
        for _ in range(20):
            est.observe(arch, ms, predicted[ids.index(arch)] * (1 + load), t, load)
            t += 0.05
    est.refresh(t)
    latencies, _ = est.latencies(2.0, 1.0)
    assert latencies[ids.index("mid")] == pytest.approx(9.0)
