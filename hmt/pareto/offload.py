"""The offload cut as a decision of the search: a variant's cost when its tail runs on a peer.

A cut ``k`` (0 <= k <= exit stage) keeps the stem and stages ``0..k-1`` on the device and
sends stage ``k``'s input over the link (cut 0: the input itself); ``None`` is all local.
Its predicted latency is CrowdHMTware's device part + transfer + peer part::

    T(k) = T_device(blocks before k) + rtt + bytes(k) * 8 / bandwidth + T_device(blocks from k) / peer_speedup

with each block's share of the variant's predicted latency taken from the predictor on
that block alone (so the shares sum to the composed prediction). The device's energy is
its own blocks' share plus ``radio_energy_per_byte`` per byte sent. :class:`OffloadCostModel`
wraps a :class:`~hmt.pareto.objectives.VariantCostModel`: every variant is priced at its
best cut for the link (least latency), which the search then trades off like any other
cost, and :meth:`OffloadCostModel.candidate` returns it as ``Candidate.offload_cut``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hmt.errors import UsageError
from hmt.pareto.encoding import Candidate
from hmt.pareto.objectives import Costs, VariantCostModel
from hmt.supernet.space import ArchConfig, SearchSpace

_BYTES_PER_VALUE = {"float32": 4, "float16": 2, "int8": 1}


@dataclass(frozen=True)
class OffloadLink:
    bandwidth_mbit_s: float
    rtt_ms: float
    peer_speedup: float = 1.0  # the peer runs a block this many times faster than the profiled device
    codec: str = "float32"
    radio_energy_per_byte: float = 0.0  # in the profile's energy unit

    def __post_init__(self) -> None:
        if not (self.bandwidth_mbit_s > 0 and math.isfinite(self.rtt_ms) and self.rtt_ms >= 0
                and self.peer_speedup > 0):
            raise UsageError(f"offload link needs bandwidth > 0, rtt >= 0 and peer_speedup > 0, got {self}")
        if self.codec not in _BYTES_PER_VALUE:
            raise UsageError(f"offload codec must be one of {list(_BYTES_PER_VALUE)}, got {self.codec!r}")

    def transfer_ms(self, values: int) -> float:
        size = values * _BYTES_PER_VALUE[self.codec] + (4 if self.codec == "int8" else 0)
        return self.rtt_ms + size * 8 / (self.bandwidth_mbit_s * 1e3)


def _stage(position: str) -> int | None:
    """Stage of a block position (``s2.b1``, ``s2.entry``); None for the stem and the exit."""
    if position.startswith("s") and "." in position:
        head = position.split(".", 1)[0][1:]
        return int(head) if head.isdigit() else None
    return None


@dataclass(frozen=True)
class CutCost:
    cut: int | None
    latency_ms: float
    device_share: float
    sent_values: int


class OffloadCostModel(VariantCostModel):
    """A :class:`VariantCostModel` that prices each variant at its best cut for ``link``."""

    def __init__(self, base: VariantCostModel, link: OffloadLink) -> None:
        super().__init__(base.net, base.blocks, base.predictor)
        self.base = base
        self.link = link
        self._best: dict[str, tuple[Costs, CutCost]] = {}

    def pairs(self, arch: ArchConfig) -> list[tuple[str, str]]:
        return self.base.pairs(arch)

    def choice_order(self, space: SearchSpace) -> dict[str, list[str]]:
        return self.base.choice_order(space)

    def cut_costs(self, arch: ArchConfig) -> list[CutCost]:
        """Local and every stage cut, with the predicted end-to-end latency of each."""
        local = self.base.costs(arch)
        pairs = self.base.pairs(arch)
        single = [self.base.predictor.predict_latency_ms([p]) for p in pairs]
        total_single = sum(single) or 1.0
        shares = [s / total_single for s in single]
        out = [CutCost(None, local.latency_ms, 1.0, 0)]
        for k in range(arch.exit_stage + 1):
            first = next((i for i, (pos, _) in enumerate(pairs) if _stage(pos) == k), None)
            if first is None:
                continue
            # Cut 0 sends what the stem reads (the input); cut k > 0 what stage k's first block reads.
            record = self.base.blocks[pairs[0] if k == 0 else pairs[first]]
            sent = math.prod(record.input_shape[1:]) if len(record.input_shape) > 1 else math.prod(record.input_shape)
            device_share = 0.0 if k == 0 else sum(shares[:first])
            latency = (local.latency_ms * device_share + self.link.transfer_ms(sent)
                       + local.latency_ms * (1 - device_share) / self.link.peer_speedup)
            out.append(CutCost(k, latency, device_share, sent))
        return out

    def best(self, arch: ArchConfig) -> tuple[Costs, CutCost]:
        hit = self._best.get(arch.arch_id)
        if hit is not None:
            return hit
        local = self.base.costs(arch)
        choice = min(self.cut_costs(arch), key=lambda c: (c.latency_ms, c.cut is not None))
        energy = local.energy * choice.device_share + self.link.radio_energy_per_byte * choice.sent_values * \
            _BYTES_PER_VALUE[self.link.codec]
        costs = replace(local, latency_ms=choice.latency_ms, energy=energy)
        self._best[arch.arch_id] = (costs, choice)
        return costs, choice

    def costs(self, arch: ArchConfig) -> Costs:
        return self.best(arch)[0]

    def candidate(self, candidate: Candidate) -> Candidate:
        """``candidate`` with its best cut as ``offload_cut`` (None: all local)."""
        return replace(candidate, offload_cut=self.best(candidate.arch)[1].cut)

    @classmethod
    def parse_link(cls, text: str) -> OffloadLink:
        """``BANDWIDTH_MBIT_S,RTT_MS[,PEER_SPEEDUP[,CODEC]]`` (the CLI's ``--offload-link``)."""
        parts = [p.strip() for p in text.split(",")]
        try:
            if not 2 <= len(parts) <= 4:
                raise ValueError("expected 2 to 4 comma-separated fields")
            return OffloadLink(float(parts[0]), float(parts[1]), float(parts[2]) if len(parts) > 2 else 1.0,
                               parts[3] if len(parts) > 3 else "float32")
        except ValueError as exc:
            raise UsageError(f"--offload-link {text!r}: expected BANDWIDTH_MBIT_S,RTT_MS[,PEER_SPEEDUP[,CODEC]] "
                             f"({exc})") from exc

    def describe(self) -> dict[str, Any]:
        return {"link": {"bandwidth_mbit_s": self.link.bandwidth_mbit_s, "rtt_ms": self.link.rtt_ms,
                         "peer_speedup": self.link.peer_speedup, "codec": self.link.codec}}
