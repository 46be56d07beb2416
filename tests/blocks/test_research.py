"""On-device re-search over the shipped sub-space: it triggers only when nothing fits (and the measurements
say so), stops within its time bound, finds a variant that fits when one exists, and what it finds joins the
optimizer's table without losing the other variants' estimates."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hmt.runtime.blocks import BlockStore, load_block_space, load_calibration
from hmt.serve.deciding.research import Research, ResearchSettings


def _research(written_blocks: Any, **settings: Any) -> Research:
    space = load_block_space(written_blocks.bundle)
    store = BlockStore(written_blocks.bundle, space)
    return Research(space, store, load_calibration(written_blocks.bundle, space),
                    ResearchSettings(**{"latency_runs": 3, "min_gap_s": 0.0, **settings}))


def test_triggers_only_when_nothing_fits_for_patience_decisions_and_measured(written_blocks: Any) -> None:
    research = _research(written_blocks, patience=2, time_bound_s=0.5)
    start = written_blocks.ids[1]
    for _ in range(5):  # something fits: never
        assert not research.offer(True, True, start, 1e-6, None, "")
    for _ in range(5):  # nothing fits, but only the prior says so: never
        assert not research.offer(False, False, start, 1e-6, None, "")
    assert not research.offer(False, True, start, 1e-6, None, "nothing fits")  # 1 of 2
    assert not research.offer(True, True, start, 1e-6, None, "")  # the streak breaks
    assert not research.offer(False, True, start, 1e-6, None, "nothing fits")
    assert research.offer(False, True, start, 1e-6, None, "nothing fits")  # 2 in a row: starts
    assert research.running
    for _ in range(3):  # one search at a time
        assert not research.offer(False, True, start, 1e-6, None, "nothing fits")
    research.stop(5.0)
    assert not research.running and research.searches == 1
    assert research.outcomes[-1].reason == "nothing fits"


def test_search_stops_within_its_time_bound(written_blocks: Any) -> None:
    research = _research(written_blocks, time_bound_s=0.6)
    t0 = time.monotonic()
    outcome, runner = research.search(written_blocks.ids[1], 1e-6, None, "test")  # nothing can fit 1 ns
    elapsed = time.monotonic() - t0
    assert runner is None and outcome.found is None
    assert outcome.evaluated >= 1
    assert elapsed <= 0.6 + 0.4, elapsed  # one timed run of slack at most (it may stop early: nothing new near)


@pytest.mark.slow
def test_search_finds_a_variant_that_fits_and_measures_its_accuracy(written_blocks: Any) -> None:
    research = _research(written_blocks, time_bound_s=3.0, seed=1)
    start = written_blocks.ids[1]
    outcome, runner = research.search(start, 1e3, None, "test")  # 1 s: every candidate fits
    assert runner is not None and outcome.found is not None
    found = outcome.found
    assert found.fits and found.latency_ms <= 0.8e3 and found.arch_id != start
    assert found.accuracy is not None and 0.0 <= found.accuracy <= 1.0
    assert found.arch_id not in research.space.accuracy  # a bundled variant is the loop's, never a find
    assert found.accuracy_source == "calibration set, on the device"
    from hmt.runtime.blocks import accuracy_on

    x, y = load_calibration(written_blocks.bundle, research.space)
    assert accuracy_on(runner, x, y) == pytest.approx(found.accuracy)
    assert outcome.found_after_s is not None and outcome.found_after_s <= 3.0
    # a memory limit below every candidate's blocks: nothing fits
    research2 = _research(written_blocks, time_bound_s=0.5)
    outcome2, runner2 = research2.search(start, 1e3, 1, "test")
    assert runner2 is None and outcome2.found is None and outcome2.evaluated >= 1


def test_a_found_variant_joins_the_table_keeping_the_estimates() -> None:
    from hmt.serve.deciding.estimates import LatencyEstimator
    from hmt.serve.deciding.research_join import _remap_estimator

    ids, priors = ["a", "c"], [1.0, 3.0]
    old = LatencyEstimator(ids, priors, ["onnxruntime"] * 2)
    for k in range(8):
        old.observe("a", 1.5 + 0.01 * k, 1.0, 0.01 * k)
        old.observe("c", 4.0 + 0.01 * k, 3.0, 0.01 * k)
    old.refresh(0.1)
    before = dict(zip(ids, old.latencies(1.0, 0.0, 0.0)[0], strict=True))
    new_ids = ["a", "b", "c"]  # the optimizer's latency order puts the new variant between them
    new = LatencyEstimator(new_ids, [1.0, 2.0, 3.0], ["onnxruntime"] * 3)
    extended = _remap_estimator(old, new, [0, 2])
    extended.refresh(0.1)
    after = dict(zip(new_ids, extended.latencies(1.0, 0.0, 0.0)[0], strict=True))
    assert after["a"] == pytest.approx(before["a"]) and after["c"] == pytest.approx(before["c"])
    assert after["b"] < after["c"]  # its own prior, not a neighbour's measurements
    assert extended.ratio("c") == pytest.approx(old.ratio("c")) and extended.ratio("b") is None


def test_blocks_and_research_need_a_bundle_with_blocks(tmp_path: Any) -> None:
    import sys
    from pathlib import Path

    from hmt.errors import UsageError
    from hmt.serve.running.session import SessionOptions, open_controller

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
    from serve_bundles import make_bundle

    bundle = make_bundle(tmp_path / "bundle")
    for options in (SessionOptions(blocks=True), SessionOptions(research=ResearchSettings())):
        with pytest.raises(UsageError, match="ships no block graphs"):
            open_controller(bundle, options)
    with pytest.raises(UsageError, match="time_bound_s > 0"):
        ResearchSettings(time_bound_s=0)


def test_candidates_are_judged_at_the_serving_ratio_of_the_start_variant(written_blocks: Any) -> None:
    research = _research(written_blocks, time_bound_s=1.0, latency_runs=5)
    start = research.space.parse(written_blocks.ids[1])
    # No measured estimate: the fixed margin alone.
    ratio, timed = research.serving_ratio(start, None, time.monotonic() + 5.0)
    assert ratio == pytest.approx(1 / research.settings.margin) and timed is None
    ratio, timed = research.serving_ratio(start, 1e4, time.monotonic() + 5.0)
    assert timed is not None and ratio == pytest.approx(1e4 / timed)
    # A limit nearby candidates meet on their medians with the margin alone (50 x the start's), but
    # not once scaled by a serving ratio of 1e4: nothing fits.
    limit_ms = 50 * timed
    outcome, runner = research.search(start.arch_id, limit_ms, None, "test", active_estimate_ms=1e4 * timed)
    assert runner is None and outcome.found is None and outcome.evaluated >= 1
    assert outcome.serving_ratio is not None and outcome.serving_ratio > 1e3
    assert outcome.active_estimate_ms == pytest.approx(1e4 * timed) and outcome.start_timed_ms is not None


class _SlowServed:
    """The runner serving the start variant (the pool's): slower than its composed copy."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.calls = delay_s, 0

    def run(self, x: Any, confidence: Any) -> None:
        self.calls += 1
        time.sleep(self.delay_s)


def test_the_serving_ratio_times_the_runner_that_served_the_start(written_blocks: Any) -> None:
    """The loop's estimate measured the start on the runner that served it; the ratio divides by
    that runner's time, not a fresh composed copy's (which would cancel the cost of composing that
    a found variant, served composed, pays)."""
    served = _SlowServed(0.02)
    space = load_block_space(written_blocks.bundle)
    research = Research(space, BlockStore(written_blocks.bundle, space),
                        load_calibration(written_blocks.bundle, space),
                        ResearchSettings(latency_runs=3, min_gap_s=0.0),
                        served=lambda arch_id: served if arch_id == written_blocks.ids[1] else None)
    start = space.parse(written_blocks.ids[1])
    ratio, timed = research.serving_ratio(start, 1e3, time.monotonic() + 5.0)
    assert served.calls == 4  # the first run and three timed ones
    assert timed is not None and timed >= 20.0 and ratio == pytest.approx(1e3 / timed)
    other = space.parse(written_blocks.ids[0])  # not served: its composed copy is timed
    _, composed_ms = research.serving_ratio(other, 1e3, time.monotonic() + 5.0)
    assert composed_ms is not None and composed_ms < 20.0 and served.calls == 4


class _Requests:
    """The serving loop's (in flight, started) as the search reads them; a fake clock moves with each read."""

    def __init__(self, busy_reads: int = 0) -> None:
        self.busy_reads = busy_reads  # reads that still see a request in flight
        self.inflight = 1 if busy_reads else 0
        self.started = 0
        self.now = 0.0

    def __call__(self) -> tuple[int, int]:
        if self.busy_reads > 0:
            self.busy_reads -= 1
            self.inflight = 1 if self.busy_reads else 0
        return self.inflight, self.started

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Runner:
    """Runs nothing; ``on_run`` is what a request does meanwhile (starts beside it)."""

    def __init__(self, on_run: Any = None) -> None:
        self.runs = 0
        self.on_run = on_run

    def run(self, x: Any, confidence: Any) -> None:
        self.runs += 1
        if self.on_run is not None:
            self.on_run(self.runs)

    def run_batch(self, x: Any, confidence: Any) -> list[Any]:
        from types import SimpleNamespace

        self.run(x, confidence)
        return [SimpleNamespace(class_index=0) for _ in range(len(x))]


def _bare_research(requests: _Requests, **settings: Any) -> Research:
    import numpy as np

    calibration = (np.zeros((20, 3, 4, 4), np.float32), np.zeros(20, np.int64))
    return Research(None, None, calibration,  # type: ignore[arg-type]  # no block store: timing and yielding only
                    ResearchSettings(**{"latency_runs": 5, **settings}), clock=lambda: requests.now,
                    requests=requests, sleep=requests.sleep)


def test_the_search_waits_for_no_request_in_flight_before_each_run() -> None:
    requests = _Requests(busy_reads=4)
    research = _bare_research(requests, yield_wait_ms=50.0)
    runner = _Runner()
    times = research._timed(runner, deadline=10.0)  # type: ignore[arg-type]
    assert times is not None and len(times) == 5
    assert requests.inflight == 0 and research.yielded_s == pytest.approx(3 * 0.0005)  # 3 sleeps, then idle


def test_the_wait_is_bounded_so_a_device_never_idle_still_searches() -> None:
    requests = _Requests(busy_reads=10**9)  # a request always in flight
    research = _bare_research(requests, yield_wait_ms=20.0)
    times = research._timed(_Runner(), deadline=10.0)  # type: ignore[arg-type]
    assert times is not None and len(times) == 5
    # each of the 5 runs waited its 20 ms bound, no longer
    assert research.yielded_s == pytest.approx(5 * 0.020, abs=0.002)


def test_a_timed_run_beside_which_a_request_started_is_run_again() -> None:
    requests = _Requests()

    def request_starts(run: int) -> None:
        if run in (2, 3):  # the warm-up is run 1: the first two timed runs overlap a request
            requests.started += 1

    research = _bare_research(requests)
    runner = _Runner(request_starts)
    times = research._timed(runner, deadline=10.0)  # type: ignore[arg-type]
    assert times is not None and len(times) == 5
    assert research.rerun == 2 and runner.runs == 1 + 5 + 2


def test_reruns_are_bounded_under_requests_that_never_stop() -> None:
    requests = _Requests()

    def request_starts(run: int) -> None:
        requests.started += 1

    research = _bare_research(requests, latency_runs=4)
    runner = _Runner(request_starts)
    times = research._timed(runner, deadline=10.0)  # type: ignore[arg-type]
    assert times is not None and len(times) == 4  # after latency_runs reruns, overlapped runs count
    assert research.rerun == 4


def test_accuracy_batches_yield_too() -> None:
    requests = _Requests(busy_reads=3)
    research = _bare_research(requests, accuracy_batch=8)
    runner = _Runner()
    assert research._accuracy(runner, deadline=10.0) == 1.0  # type: ignore[arg-type]
    assert runner.runs == 3  # 20 images in batches of 8
    assert research.yielded_s > 0


def test_no_wait_without_a_serving_loop_or_with_the_wait_off() -> None:
    requests = _Requests(busy_reads=10**9)
    research = _bare_research(requests, yield_wait_ms=0.0)
    assert research._timed(_Runner(), deadline=10.0) is not None  # type: ignore[arg-type]
    assert research.yielded_s == 0.0
    with pytest.raises(Exception, match="yield_wait_ms"):
        ResearchSettings(yield_wait_ms=-1.0)


class _Sleeper:
    """A runner that takes ``delay_s`` a run (real time)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def run(self, x: Any, confidence: Any) -> None:
        time.sleep(self.delay_s)


def test_a_found_variant_is_confirmed_against_the_start_timed_in_turn() -> None:
    """The search judged candidates on medians timed seconds apart; a variant slower than the start
    (timed fast in a quiet moment) was adopted. Timed in turn with the start, it is not."""
    import numpy as np

    start = _Sleeper(0.004)
    calibration = (np.zeros((4, 3, 4, 4), np.float32), np.zeros(4, np.int64))
    research = Research(None, None, calibration,  # type: ignore[arg-type]  # the start is the served runner
                        ResearchSettings(latency_runs=3), served=lambda arch_id: start)
    config = type("C", (), {"arch_id": "start"})()
    deadline = time.monotonic() + 10.0
    # the loop measured the start at 10 ms as served; the budget is 8 ms
    ok, ratio = research.confirm(config, _Sleeper(0.006), 8.0, 10.0, deadline)  # type: ignore[arg-type]
    assert not ok and ratio is not None and ratio > 1.2
    ok, ratio = research.confirm(config, _Sleeper(0.001), 8.0, 10.0, deadline)  # type: ignore[arg-type]
    assert ok and ratio is not None and ratio < 0.6
    ok, ratio = research.confirm(config, _Sleeper(0.001), 8.0, 10.0, time.monotonic() - 1.0)  # type: ignore[arg-type]
    assert not ok and ratio is None  # past the deadline: nothing is adopted


def test_a_found_variant_already_in_the_table_releases_its_blocks() -> None:
    """The search may time a bundled variant (a neighbour of the start) and find it fits; adopt left it out of
    the table but kept its composed runner open, so its blocks stayed acquired in the shared store: never
    unloaded, and counted in the pool's memory after the pool evicted that variant."""
    import threading
    from types import SimpleNamespace

    from hmt.serve.deciding.research import Measured
    from hmt.serve.deciding.research_join import adopt

    closed: list[bool] = []
    runner: Any = SimpleNamespace(warm=True, close=lambda: closed.append(True))
    controller: Any = SimpleNamespace(_tick_lock=threading.Lock(), estimator=None,
                                      optimizer=SimpleNamespace(variants=[SimpleNamespace(arch_id="a")]),
                                      request_tick=lambda: None)
    adopt(controller, Measured("a", 1.0, 1.2, (1.0,), 10, True, 0.5, "blocks.json"), runner)
    assert closed == [True]


def test_a_bundled_variant_the_search_times_is_a_path_not_a_find(written_blocks: Any) -> None:
    """The search may time a bundled variant (a neighbour of the start) and find that it fits; it never
    hands one over as found: the loop has it and judges it on its own requests (status listed such a
    variant as found, and adopt added nothing). Here every mutation is the other bundled variant."""
    research = _research(written_blocks, time_bound_s=1.0)
    start = written_blocks.ids[1]
    other = next(a for a in research.space.accuracy if a != start)
    timed: list[str] = []
    real_evaluate = research.evaluate

    def evaluate(config: Any, *args: Any) -> Any:
        timed.append(config.arch_id)
        return real_evaluate(config, *args)

    research.evaluate = evaluate  # type: ignore[method-assign]
    research.mutate = lambda anchor, cheaper=False: research.start_config(other)  # type: ignore[method-assign]
    outcome, runner = research.search(start, 1e3, None, "test")  # 1 s: it fits
    assert timed == [other]
    assert runner is None and outcome.found is None and research.status()["found"] == []
