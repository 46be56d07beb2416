"""Codec, link estimate, breaker and the planner's choice of variant and cut (fake clock, no I/O)."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.errors import UsageError
from hmt.offload.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from hmt.offload.codec import CodecError, decode, encode, wire_bytes
from hmt.offload.link import LinkEstimate, LinkEstimator
from hmt.offload.planner import Conditions, CutCost, OffloadPlanner, PlannerConfig, VariantCost


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_codecs_round_trip_and_shrink() -> None:
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    for codec, tolerance, size in (("float32", 0.0, 1024), ("float16", 2e-3, 512), ("int8", 0.02, 256)):
        enc = encode(x, codec)
        assert len(enc.body) == size and wire_bytes(x.size, codec) >= size
        back = decode(enc.body, enc.headers, x.shape)
        assert back.dtype == np.float32 and np.max(np.abs(back - x)) <= tolerance * np.max(np.abs(x)) + 1e-12


@pytest.mark.parametrize(("headers", "body", "status"), [
    ({"x-hmt-codec": "float32", "x-hmt-shape": "1,4"}, b"\0" * 15, 400),  # short body
    ({"x-hmt-codec": "float32", "x-hmt-shape": "1,5"}, b"\0" * 20, 422),  # not the cut's shape
    ({"x-hmt-codec": "bfloat", "x-hmt-shape": "1,4"}, b"\0" * 16, 400),
    ({"x-hmt-codec": "int8", "x-hmt-shape": "1,4", "x-hmt-scale": "nan"}, b"\0" * 4, 400),
    ({"x-hmt-codec": "float32", "x-hmt-shape": "1,a"}, b"\0" * 16, 400),
    ({"x-hmt-codec": "float32", "x-hmt-shape": "1,4"}, np.array([1, np.inf, 0, 0], np.float32).tobytes(), 422),
])
def test_malformed_tensors_are_refused(headers: dict[str, str], body: bytes, status: int) -> None:
    with pytest.raises(CodecError) as info:
        decode(body, headers, (1, 4))
    assert info.value.status == status


def test_link_estimate_follows_transfers_and_jumps_on_a_slow_link() -> None:
    clock = FakeClock()
    link = LinkEstimator(clock, initial_rtt_ms=1.0)
    link.observe_rtt(1.0)
    link.observe_transfer(12500, 1.0 + 1.0)  # 12.5 kB in 1 ms: 100 Mbit/s
    assert link.estimate().bandwidth_mbit_s == pytest.approx(100, rel=0.01)
    link.observe_transfer(12500, 40.0 + 50.0)  # far worse once: an outlier, smoothed
    assert link.estimate().transfer_ms(12500) < 40.0
    link.observe_transfer(12500, 40.0 + 50.0)  # twice in a row: the link got worse, priced at once
    assert link.estimate().transfer_ms(12500) == pytest.approx(90.0)
    for _ in range(5):  # the RTT is the least of the last 5: noise never lowers it, a real rise shows
        link.observe_rtt(40.0)
    assert link.estimate().rtt_ms == 40.0
    for _ in range(8):
        link.observe_transfer(12500, 40.0 + 50.0)  # 2 Mbit/s; the per-byte cost converges to it
    est = link.estimate()
    assert est.bandwidth_mbit_s == pytest.approx(2, rel=0.1)
    assert est.transfer_ms(12500) == pytest.approx(90.0, rel=0.05)


def test_breaker_opens_backs_off_and_closes() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(clock, np.random.default_rng(0), base_backoff_s=1.0, max_backoff_s=4.0, jitter=0.0)
    assert breaker.allow()
    breaker.failure("refused")
    assert breaker.state == OPEN and not breaker.allow()
    clock.t += 1.01
    assert breaker.allow() and breaker.state == HALF_OPEN
    assert not breaker.allow()  # one trial at a time
    breaker.failure("refused")  # the trial failed: open again, backoff doubled
    clock.t += 1.5
    assert not breaker.allow()
    clock.t += 0.6
    assert breaker.allow()
    breaker.success()
    assert breaker.state == CLOSED and breaker.backoff_s == 1.0 and breaker.opens == 2


def _planner(clock: FakeClock, **config: float) -> OffloadPlanner:
    # One variant, 10 ms locally. Cut 0 sends the 12 kB input; cut 1 runs 3 ms here and sends 1 kB.
    cuts = (CutCost(0, 0.0, 1.0, {"float32": 12288, "float16": 6144, "int8": 3076}),
            CutCost(1, 3.0, 0.7, {"float32": 1024, "float16": 512, "int8": 260}))
    variants = [VariantCost("v", 0.9, 1.0, 10.0, cuts)]
    return OffloadPlanner(variants, PlannerConfig(codecs=("float32",), **config), clock)


def _link(mbit_s: float, rtt_ms: float) -> LinkEstimate:
    return LinkEstimate(rtt_ms, 8e-3 / mbit_s, 10, 0.0)


def test_the_cut_follows_the_bandwidth() -> None:
    clock = FakeClock()
    planner = _planner(clock, min_dwell_s=1.0)
    fast = Conditions(link=_link(100, 1.0), budget_ms=30.0)
    choice = planner.decide(fast)
    assert choice.option.cut == 0 and choice.switched  # 0 + 1 + 0.98 + 1 = ~3 ms
    slow = Conditions(link=_link(5, 4.0), budget_ms=30.0)  # 12 kB: 19.7 ms on the wire; 1 kB: 1.6 ms
    assert planner.decide(slow).option.cut == 0  # within the dwell time: stays (both feasible)
    clock.t += 1.5
    choice = planner.decide(slow)
    assert choice.option.cut == 1 and choice.switched
    very_slow = Conditions(link=_link(0.2, 40.0), budget_ms=30.0)
    choice = planner.decide(very_slow)  # cut 1 is now over budget: left at once, no dwell
    assert choice.option.cut is None and choice.reason == "current option over budget"
    clock.t += 1.5
    choice = planner.decide(fast)
    assert choice.option.cut == 0 and planner.switches == 3


def test_hysteresis_keeps_a_nearly_as_good_cut() -> None:
    clock = FakeClock()
    planner = _planner(clock, min_dwell_s=0.0, hysteresis=0.15)
    assert planner.decide(Conditions(link=_link(5, 1.0), budget_ms=30.0)).option.cut == 1
    # ~36.7 Mbit/s: cut 0 predicted 4.68 ms, cut 1 4.92 ms: 5% better is inside the 15% band.
    choice = planner.decide(Conditions(link=LinkEstimate(1.0, 2.1785e-4, 10, 0.0), budget_ms=30.0))
    assert choice.best.cut == 0 and choice.option.cut == 1 and choice.reason == "within hysteresis"
    link = LinkEstimate(1.0, 0.0, 10, 0.0)  # infinitely fast: cut 0 = 2.0 ms, cut 1 = 4.7 ms
    assert planner.decide(Conditions(link=link, budget_ms=30.0)).option.cut == 0


def test_peer_unusable_means_local_and_the_slow_device_offloads() -> None:
    clock = FakeClock()
    planner = _planner(clock, min_dwell_s=0.0)
    assert planner.decide(Conditions(link=None, budget_ms=30.0)).option.cut is None
    # Local is faster on a good day; a device 4x slower than its warm-up sends the input away.
    assert planner.decide(Conditions(link=_link(2, 1.0), budget_ms=30.0)).option.cut is None
    assert planner.decide(Conditions(link=_link(100, 1.0), budget_ms=30.0, device_ratio=4.0)).option.cut == 0


def test_codec_is_chosen_when_it_pays() -> None:
    clock = FakeClock()
    cuts = (CutCost(0, 0.0, 1.0, {"float32": 12288, "float16": 6144, "int8": 3076},
                    {"float32": 0.01, "float16": 0.05, "int8": 0.1}),)
    planner = OffloadPlanner([VariantCost("v", 0.9, 1.0, 50.0, cuts)], PlannerConfig(min_dwell_s=0), clock)
    assert planner.decide(Conditions(link=LinkEstimate(1.0, 0.0, 1, 0), budget_ms=60)).option.codec == "float32"
    assert planner.decide(Conditions(link=_link(2, 1.0), budget_ms=60)).option.codec == "int8"
    with pytest.raises(UsageError):
        PlannerConfig(codecs=("int8",))


def test_a_late_remote_part_is_planned_at_its_tail() -> None:
    clock = FakeClock()
    planner = _planner(clock, min_dwell_s=0.0)
    fast = _link(100, 1.0)
    assert planner.decide(Conditions(link=fast, budget_ms=30.0)).option.cut == 0  # ~3 ms predicted vs 10 local
    # The remote part has been 4x its prediction at the 90th percentile: ~12 ms, local wins.
    choice = planner.decide(Conditions(link=fast, budget_ms=30.0, remote_factor=4.0))
    assert choice.option.cut is None and choice.best.cut is None
