"""A busy device's own delays are its own: not the link's (fake peer, fake clock, fake timings).

The bench's busy-device phase (benchmarks/offload/results/shipped_bundle.json) missed its target:
every round trip the device measured held its own wait for its throttled core, which
was charged to the link, so offloading looked as slow as the busy device itself. The
timings below are those of that bench: a 1.2 ms variant, a peer tail of 1.7 ms, a
1 ms / 100 Mbit/s link; the busy device's exchanges wait 4-64 ms for their core (the
p10-p90 measured there for a 0.3 ms burst after a network wait) and its local runs take
1-73x their warm time.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import cycle
from typing import Any

import numpy as np
import pytest

from hmt.bundle import load_bundle
from hmt.deploy.offload import OffloadBundles
from hmt.offload.device import WHERE_PEER, DeviceOptions, OffloadDevice
from hmt.offload.plan import load_plan
from hmt.offload.planner import PlannerConfig
from hmt.offload.timing import DeviceShare, RecentTail

RTT_MS = 1.0
MS_PER_BYTE = 8e-5  # 100 Mbit/s
CPU_MS = 0.3  # the device's CPU in one HTTP exchange
PEER_TAIL_MS = 1.7
LOCAL_WARM_MS = 1.2


@dataclass
class FakeReply:
    body: dict[str, Any]
    elapsed_ms: float
    device: DeviceShare


class FakePeer:
    """Answers as a peer over the link above would; each exchange also spends ``wait_ms`` of the
    device's own time waiting for its core (what ``/proc/thread-self/schedstat`` counts)."""

    url = "http://fake-peer"

    def __init__(self, tails: int) -> None:
        self.tails = tails
        self.wait_ms = 0.0
        self.segments = 0

    def _reply(self, body: dict[str, Any], size: int, peer_ms: float) -> FakeReply:
        elapsed = RTT_MS + size * MS_PER_BYTE + peer_ms + CPU_MS + self.wait_ms
        return FakeReply(body, elapsed, DeviceShare(CPU_MS, self.wait_ms))

    def status(self, limit_ms: float) -> FakeReply:
        return self._reply({"variants": {"deep": {"tail_ms": [PEER_TAIL_MS] * self.tails}},
                            "load": {"compute_ratio": 1.0}}, 0, 0.0)

    def probe(self, size_bytes: int, limit_ms: float) -> FakeReply:
        return self._reply({"bytes": size_bytes}, size_bytes, 0.0)

    def segment(self, arch_id: str, cut: int, body: bytes, headers: dict[str, str], *, confidence: float | None,
                limit_ms: float, graphs_sha256: str | None = None) -> FakeReply:
        self.segments += 1
        return self._reply({"class": 0, "confidence": 0.9, "exit": 1, "compute_ms": PEER_TAIL_MS,
                            "queue_ms": 0.0, "server_ms": PEER_TAIL_MS}, len(body), PEER_TAIL_MS)

    def close(self) -> None:
        pass


def _device(offload_bundles: OffloadBundles, now: list[float]) -> tuple[OffloadDevice, FakePeer]:
    bundle = load_bundle(offload_bundles.device)
    plan = load_plan(bundle)
    peer = FakePeer(len(plan.for_variant("deep")))
    device = OffloadDevice(bundle, plan, peer,  # type: ignore[arg-type]
                           DeviceOptions(budget_ms=200.0, fixed_variant="deep"),
                           planner_config=PlannerConfig(min_dwell_s=0.5), rng=np.random.default_rng(0),
                           clock=lambda: now[0], warmup_runs=1)
    chain = device.chains["deep"]
    chain.segment_ms = [0.6, 0.5]  # the warm times of the bench's variant, not this tiny one's
    chain.exit_ms = [0.05, 0.1]
    assert chain.device_ms(None) == pytest.approx(LOCAL_WARM_MS)
    return device, peer


def _step(device: OffloadDevice, now: list[float], local_ratio: float) -> None:
    now[0] += 0.25
    device.refresh_peer_status()
    device.probe_bandwidth()
    device.observe_device_run(LOCAL_WARM_MS * local_ratio, LOCAL_WARM_MS)
    device.choose()


def test_a_busy_device_does_not_charge_its_own_waits_to_the_link(offload_bundles: OffloadBundles) -> None:
    now = [100.0]
    device, peer = _device(offload_bundles, now)
    for _ in range(12):  # idle: the device is fast, so local wins
        _step(device, now, 1.0)
    assert device.choose().option.cut is None
    link = device.link.estimate()
    assert link.rtt_ms == pytest.approx(RTT_MS, abs=0.2) and link.bandwidth_mbit_s > 50

    waits, ratios = cycle([4, 24, 24, 64, 10, 30, 8, 40]), cycle([1, 17, 17, 30, 73, 10, 17, 5, 73, 17])
    for _ in range(40):  # 10 s busy: every exchange waits for the core, local runs are slow
        peer.wait_ms = next(waits)
        _step(device, now, next(ratios))
    link = device.link.estimate()
    # The link did not change, so its estimate must not either (before the fix: RTT 5+ ms and
    # a few Mbit/s, from the device's own waits).
    assert link.rtt_ms == pytest.approx(RTT_MS, abs=0.2)
    assert link.bandwidth_mbit_s > 50
    choice = device.choose()
    options = {o.cut: o for o in device.planner.options(device.conditions())}
    # The local run's tail (1.2 ms x ~73) is far worse than one exchange's (~64 ms + link + peer).
    assert options[None].predicted_ms > options[0].predicted_ms
    assert choice.option.cut is not None, choice

    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    for _ in range(10):  # requests offloaded from the busy device: their round trips keep the link right
        peer.wait_ms = next(waits)
        now[0] += 0.05
        result = device.predict(x)
        assert result.where == WHERE_PEER
    link = device.link.estimate()
    assert link.rtt_ms == pytest.approx(RTT_MS, abs=0.2) and link.bandwidth_mbit_s > 50
    assert device.remote_factor() == pytest.approx(1.0, abs=0.05)  # link + peer as predicted
    assert peer.segments == 10


def test_device_share_without_run_queue_counts_scales_cpu_with_the_slowdown() -> None:
    assert DeviceShare(0.5, 4.0).wall_ms(10.0) == 4.5  # measured: CPU + wait
    assert DeviceShare(0.5, None).wall_ms(10.0) == 5.0  # not counted here: CPU x the device's slowdown
    assert DeviceShare(0.5, None).wall_ms(0.5) == 0.5


def test_recent_tail_forgets_old_samples() -> None:
    now = [0.0]
    tail = RecentTail(lambda: now[0], window_s=5.0, quantile=0.9, min_samples=3)
    assert tail.value(7.0) == 7.0
    for v in (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 50.0):
        tail.add(v)
    assert tail.value(7.0) > 5.0  # one slow run in ten is the tail
    now[0] = 6.0
    assert tail.value(7.0) == 7.0


def test_recent_tail_caches_its_quantile_until_a_sample_or_time_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    import hmt.offload.timing as timing

    now = [0.0]
    tail = RecentTail(lambda: now[0], window_s=5.0, quantile=0.9, min_samples=3)
    for v in (1.0, 2.0, 3.0, 4.0):
        tail.add(v)
    calls = [0]
    real = timing.np.percentile

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(timing.np, "percentile", counting)
    first = tail.value(7.0)
    assert tail.value(7.0) == first and calls[0] == 1  # cached
    tail.add(100.0)
    assert tail.value(7.0) > first and calls[0] == 2  # a new sample invalidates it
    now[0] += RecentTail.CACHE_S
    tail.value(7.0)
    assert calls[0] == 3  # and so does time (samples leave the window)
