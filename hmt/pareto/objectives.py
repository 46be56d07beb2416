"""The cost objectives of a variant: predicted latency and energy, and memory.

Costs come per block: every (position, choice) of the supernet, stem, entries and exit
heads included, is measured once at its real input shape (parameters, activation peak,
MACs, per-layer features). A variant's costs are then sums (maxima for the activation
peak) over the blocks it executes, ``Supernet.variant_blocks(arch)``: microseconds per
variant, so NearbyInit / NearbyMutate can price hundreds of moves per candidate.

- latency: the profile's block table when it has one for this supernet (AdaptiveNet
  5.1: the engine's fixed cost once + each block's net time; with the profile's
  composition correction, fitted on variants measured end to end, when it has one at
  batch 1: ``Predictor.block_sum_ms``), else CrowdHMTware eq. 2
  over the variant's layers with the profile's fitted coefficients. Eq. 2 is a sum over
  layers with each layer's cache-hit rate taken from its own working set, so summing
  per-block predictions equals predicting the whole variant (tested).
- energy: CrowdHMTware eq. 1 over the same layers; in mJ when the profile's energy
  model is calibrated, else in the profile's relative unit (MAC-equivalents).
- memory: parameters (fp32) + activation peak, in MB (10^6 bytes).

``CostPredictor`` is the seam: anything with ``predict_latency_ms(pairs)`` and
``predict_energy(pairs)`` over (position, choice) pairs can stand in for a profile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hmt.errors import ArtifactError
from hmt.supernet.space import WIDTH_KIND, WIDTH_RATIOS, ArchConfig, SearchSpace

if TYPE_CHECKING:
    from hmt.profile.features import LayerFeature
    from hmt.profile.schema import DeviceProfile

BYTES_PER_PARAM = 4
BYTES_PER_MB = 1_000_000
COST_METRICS: tuple[str, ...] = ("latency_ms", "energy", "memory_mb")
Pair = tuple[str, str]


@dataclass(frozen=True)
class BlockCost:
    params: int
    macs: int
    activation_peak_bytes: int
    input_shape: tuple[int, ...]
    layers: tuple[Any, ...]  # LayerFeature records (hmt.profile.features)


@dataclass(frozen=True)
class Costs:
    latency_ms: float
    energy: float
    memory_mb: float
    params: int
    macs: int
    activation_peak_bytes: int

    def metric(self, name: str) -> float:
        return float(getattr(self, name))

    def to_json_dict(self) -> dict[str, float | int]:
        return {"latency_ms": self.latency_ms, "energy": self.energy, "memory_mb": self.memory_mb,
                "params": self.params, "macs": self.macs, "activation_peak_bytes": self.activation_peak_bytes}


class CostPredictor(Protocol):
    """Predicted latency and energy of a variant from the blocks it executes."""

    energy_unit: str

    def predict_latency_ms(self, pairs: Sequence[Pair]) -> float: ...

    def predict_energy(self, pairs: Sequence[Pair]) -> float: ...

    def describe(self) -> dict[str, Any]: ...


def measure_block_costs(net: Any) -> dict[Pair, BlockCost]:
    """Cost records of every (position, choice) of a supernet (``iter_block_choices``)."""
    from hmt.profile.features import layer_features
    from hmt.supernet.metrics import measure_cost

    table: dict[Pair, BlockCost] = {}
    for ref in net.iter_block_choices():
        cost = measure_cost(ref.module, tuple(ref.input_shape))
        table[(ref.position, ref.choice)] = BlockCost(
            params=cost.params, macs=cost.macs, activation_peak_bytes=cost.activation_peak_bytes,
            input_shape=tuple(ref.input_shape), layers=tuple(layer_features(ref.module, ref.input_shape)),
        )
    return table


def _coefficients(model: Mapping[str, Any], names: Sequence[str], what: str, profile_name: str) -> np.ndarray:
    """Coefficients in the design's column order, matched by name (never by dict order)."""
    coefs = model.get("coefficients", {})
    missing = [n for n in names if n not in coefs]
    if missing:
        raise ArtifactError(f"profile {profile_name!r}: {what} model lacks coefficients {missing}")
    return np.array([float(coefs[n]["value"]) for n in names])


class ProfilePredictor:
    """``CostPredictor`` over a device profile (``hmt.profile``)."""

    def __init__(self, profile: DeviceProfile, blocks: Mapping[Pair, BlockCost], space: SearchSpace, *,
                 use_block_table: bool = True) -> None:
        from hmt.profile.fits import LATENCY_FORMS, energy_design, latency_design
        from hmt.profile.predictor import Predictor

        self.profile = profile
        self.predictor = Predictor(profile)
        self.name = profile.name
        models = profile.doc.get("models", {})
        self.use_block_table = use_block_table and self.predictor.has_block_table
        if self.use_block_table:
            check_block_table(profile, blocks, space)
        elif "latency" not in models:
            raise ArtifactError(f"profile {profile.name!r} has neither a block latency table nor a latency model")
        if "energy" not in models:
            raise ArtifactError(f"profile {profile.name!r} has no energy model")
        self.energy_unit = "mJ" if models["energy"].get("calibrated") else str(models["energy"].get("unit", "1"))
        self.latency_form = "block-table" if self.use_block_table else str(models["latency"]["form"])
        if self.use_block_table and self.predictor.corrects(1):
            self.latency_form = "block-table+composition"
        if not self.use_block_table and self.latency_form not in LATENCY_FORMS:
            raise ArtifactError(f"profile {profile.name!r}: unknown latency model form {self.latency_form!r}")
        hit = self.predictor.hit_rate
        self._latency: dict[Pair, float] = {}
        self._energy: dict[Pair, float] = {}
        lat_coef: np.ndarray | None = None
        shared = len(models["energy"].get("coefficients", {})) == 4
        for pair, block in blocks.items():
            layers: Sequence[LayerFeature] = block.layers
            eps = [[hit(f.bytes_moved) for f in layers]]
            design, names = energy_design([layers], eps, shared_memory=shared)
            coef = _coefficients(models["energy"], names, "energy", profile.name)
            self._energy[pair] = float(design[0] @ coef)
            if not self.use_block_table:
                design, names = latency_design([layers], eps, form=self.latency_form)
                if lat_coef is None:
                    lat_coef = _coefficients(models["latency"], names, "latency", profile.name)
                self._latency[pair] = float(design[0] @ lat_coef)

    def predict_latency_ms(self, pairs: Sequence[Pair]) -> float:
        if self.use_block_table:  # composition-corrected when the profile has a batch-1 correction
            return self.predictor.block_sum_ms(pairs)
        return float(sum(self._latency[p] for p in pairs))

    def predict_energy(self, pairs: Sequence[Pair]) -> float:
        return float(sum(self._energy[p] for p in pairs))

    def describe(self) -> dict[str, Any]:
        device = self.profile.doc["device"]
        return {"name": self.name, "id": device.get("id"), "origin": device.get("origin"),
                "engine": device.get("engine"), "latency_model": self.latency_form, "energy_unit": self.energy_unit}


def check_block_table(profile: DeviceProfile, blocks: Mapping[Pair, BlockCost], space: SearchSpace) -> None:
    """Refuse a block table made for another supernet.

    The table must name this space (``doc.supernet.space_tag`` when recorded), and hold a
    batch-1 row for every (position, choice) at the input shape this supernet feeds it. A
    table of another training run of the *same* space is accepted: latency does not
    depend on the weights.
    """
    where = profile.doc.get("supernet", {}) or {}
    tag = where.get("space_tag")
    if tag is not None and tag != space.tag:
        raise ArtifactError(f"profile {profile.name!r} was measured for supernet space {tag}, this supernet's space "
                            f"is {space.tag}; profile the device with this supernet (--supernet)")
    table = profile.table("block_latency")
    rows = table[table["batch"] == 1]
    shapes = {(str(r.position), str(r.choice)): str(r.input_shape) for r in rows.itertuples(index=False)}
    missing = [f"{p}/{c}" for (p, c) in blocks if (p, c) not in shapes]
    wrong = [f"{p}/{c} ({shapes[(p, c)]} vs {'x'.join(map(str, b.input_shape))})" for (p, c), b in blocks.items()
             if (p, c) in shapes and shapes[(p, c)] != "x".join(map(str, b.input_shape))]
    if missing or wrong:
        made_for = where.get("path", "another supernet")
        detail = (f"no batch-1 row for {', '.join(missing[:6])}" if missing else
                  f"other input shapes: {', '.join(wrong[:4])}")
        raise ArtifactError(f"profile {profile.name!r}: its block latency table was made for {made_for}, not this "
                            f"supernet ({space.tag}): {detail}; profile the device with this supernet (--supernet)")


class VariantCostModel:
    """Costs of variants (memoised by arch id) from block costs and a predictor."""

    def __init__(self, net: Any, blocks: Mapping[Pair, BlockCost], predictor: CostPredictor) -> None:
        self.net = net
        self.blocks = blocks
        self.predictor = predictor
        self._memo: dict[str, Costs] = {}

    @property
    def energy_unit(self) -> str:
        return self.predictor.energy_unit

    def pairs(self, arch: ArchConfig) -> list[Pair]:
        return list(self.net.variant_blocks(arch))

    def costs(self, arch: ArchConfig) -> Costs:
        hit = self._memo.get(arch.arch_id)
        if hit is not None:
            return hit
        pairs = self.pairs(arch)
        records = [self.blocks[p] for p in pairs]
        params = sum(r.params for r in records)
        peak = max(r.activation_peak_bytes for r in records)
        costs = Costs(
            latency_ms=self.predictor.predict_latency_ms(pairs),
            energy=self.predictor.predict_energy(pairs),
            memory_mb=(params * BYTES_PER_PARAM + peak) / BYTES_PER_MB,
            params=params,
            macs=sum(r.macs for r in records),
            activation_peak_bytes=peak,
        )
        self._memo[arch.arch_id] = costs
        return costs

    def choice_order(self, space: SearchSpace) -> dict[str, list[str]]:
        """Each position's choices from cheapest to dearest (latency of the block alone)."""
        order: dict[str, list[str]] = {}
        for pos in space.positions:
            if pos.kind == WIDTH_KIND:
                # A stream width is no unit of its own: narrower streams cost less.
                order[pos.name] = sorted(pos.choices, key=lambda c: WIDTH_RATIOS[c])
                continue
            price = {c: self.predictor.predict_latency_ms([(pos.name, c)]) for c in pos.choices}
            order[pos.name] = sorted(pos.choices, key=lambda c: (price[c], pos.choices.index(c)))
        return order
