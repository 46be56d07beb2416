"""The offload cut in pareto: each variant priced at its best cut for a link (fake cost model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from hmt.errors import UsageError
from hmt.pareto.encoding import Candidate
from hmt.pareto.objectives import BlockCost, Costs
from hmt.pareto.offload import OffloadCostModel, OffloadLink


@dataclass(frozen=True)
class Arch:
    arch_id: str
    exit_stage: int

    def to_json_dict(self) -> dict[str, object]:
        return {"arch_id": self.arch_id}


class Predictor:
    energy_unit = "mJ"
    ms: ClassVar[dict[str, float]] = {"stem": 1.0, "s0.b0": 4.0, "s1.entry": 1.0, "s1.b0": 4.0, "exit1": 0.5}

    def predict_latency_ms(self, pairs: list[tuple[str, str]]) -> float:
        return sum(self.ms[p] for p, _ in pairs)


class Base:
    """Stem reads 3x32x32; stage 0 reads 16x32x32 (big); stage 1 reads 32x4x4 (small)."""

    energy_unit = "mJ"
    net = None

    def __init__(self) -> None:
        self.predictor = Predictor()
        shapes = {"stem": (1, 3, 32, 32), "s0.b0": (1, 16, 32, 32), "s1.entry": (1, 32, 4, 4),
                  "s1.b0": (1, 32, 4, 4), "exit1": (1, 32, 4, 4)}
        self.blocks = {(p, "base"): BlockCost(0, 0, 0, s, ()) for p, s in shapes.items()}

    def pairs(self, arch: Arch) -> list[tuple[str, str]]:
        return [(p, "base") for p in Predictor.ms]

    def costs(self, arch: Arch) -> Costs:
        return Costs(latency_ms=10.5, energy=100.0, memory_mb=1.0, params=0, macs=0, activation_peak_bytes=0)


def _model(link: OffloadLink) -> OffloadCostModel:
    return OffloadCostModel(Base(), link)  # type: ignore[arg-type]


def test_cut_latency_adds_transfer_and_peer_time() -> None:
    model = _model(OffloadLink(bandwidth_mbit_s=8.0, rtt_ms=2.0, peer_speedup=5.0))
    cuts = {c.cut: c for c in model.cut_costs(Arch("a", 1))}
    assert set(cuts) == {None, 0, 1}
    # cut 0: 3072 fp32 values = 12288 B at 8 Mbit/s = 12.3 ms + 2 ms RTT + 10.5 / 5 on the peer.
    assert cuts[0].latency_ms == pytest.approx(2.0 + 12.288 + 2.1)
    # cut 1: stem + stage 0 here (5 of 10.5 single-block ms), 512 values sent, the rest on the peer.
    share = 5.0 / 10.5
    assert cuts[1].device_share == pytest.approx(share) and cuts[1].sent_values == 512
    assert cuts[1].latency_ms == pytest.approx(10.5 * share + 2.0 + 2.048 + 10.5 * (1 - share) / 5)


def test_best_cut_follows_the_link() -> None:
    arch = Arch("a", 1)
    fast = _model(OffloadLink(bandwidth_mbit_s=1000.0, rtt_ms=0.5, peer_speedup=5.0))
    picked = fast.candidate(Candidate(arch))  # type: ignore[arg-type]
    assert picked.offload_cut == 0 and picked.to_json_dict()["offload_cut"] == 0
    assert fast.costs(arch).latency_ms < 10.5 and fast.costs(arch).energy == 0.0  # type: ignore[arg-type]
    mid = _model(OffloadLink(bandwidth_mbit_s=8.0, rtt_ms=0.5, peer_speedup=5.0))  # cut 1: 8.65 ms, cut 0: 14.9
    assert mid.candidate(Candidate(arch)).offload_cut == 1  # type: ignore[arg-type]
    slow = _model(OffloadLink(bandwidth_mbit_s=0.5, rtt_ms=40.0, peer_speedup=5.0))
    chosen = slow.candidate(Candidate(arch))  # type: ignore[arg-type]
    assert chosen.offload_cut is None
    assert slow.costs(arch).latency_ms == 10.5  # type: ignore[arg-type]


def test_link_option_parses_and_refuses() -> None:
    link = OffloadCostModel.parse_link("20, 5, 4, int8")
    assert (link.bandwidth_mbit_s, link.rtt_ms, link.peer_speedup, link.codec) == (20.0, 5.0, 4.0, "int8")
    for bad in ("20", "a,1", "20,1,0", "20,1,2,bf16"):
        with pytest.raises(UsageError, match="--offload-link|offload"):
            OffloadCostModel.parse_link(bad)
