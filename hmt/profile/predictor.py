"""Predict a variant's latency and energy from a device profile.

- Block-table sum (AdaptiveNet 5.1): the engine's fixed cost once plus the net cost of
  each (position, choice) the variant executes. A pair missing from the table is refused
  by name (never counted as 0 ms). When the profile carries a composition correction
  fitted on variants measured end to end (``models.latency_composition``, see
  ``composition``) at the batch asked for, ``block_sum_ms`` applies it;
  ``raw_block_sum_ms`` is the uncorrected sum. A profile without it predicts as before.
- CrowdHMTware eq. 2 over per-layer features, with the fitted coefficients; eq. 1 for
  energy (MAC-equivalents until calibrated, then mJ).
- Under background load: the idle prediction times ``1 + alpha * I`` (``fits.LoadModel``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hmt.errors import InputError, ModelError
from hmt.profile.composition import CompositionFeatures, CompositionModel
from hmt.profile.features import LayerFeature
from hmt.profile.fits import LoadModel, energy_design, latency_design
from hmt.profile.parsers import interpolate_hit_rate
from hmt.profile.schema import DeviceProfile


@dataclass(frozen=True)
class HitRateCurve:
    sizes_bytes: tuple[int, ...]
    rates: tuple[float, ...]

    def __call__(self, working_set_bytes: float) -> float:
        return interpolate_hit_rate(working_set_bytes, self.sizes_bytes, self.rates)

    @classmethod
    def from_profile(cls, profile: DeviceProfile) -> HitRateCurve:
        table = profile.table("cache_hit_rate")
        return cls(tuple(int(s) for s in table["size_bytes"]), tuple(float(r) for r in table["hit_rate"]))


def _coefficients(model: dict, names: Sequence[str]) -> np.ndarray:
    """Coefficients in the design matrix's column order, matched by name: profile JSON is
    written key-sorted, so the stored order is not the fit's."""
    stored = model["coefficients"]
    missing = [n for n in names if n not in stored]
    if missing:
        raise InputError(f"profile model {model.get('form')!r} lacks coefficients {missing}")
    return np.asarray([float(stored[n]["value"]) for n in names])


class Predictor:
    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        self._table: dict[tuple[str, str, int], tuple[float, float]] = {}
        self._layers: dict[tuple[str, str, int], int] = {}
        if "block_latency" in profile.tables:
            frame = profile.table("block_latency")
            has_layers = "n_layers" in frame.columns
            for row in frame.itertuples(index=False):
                key = (str(row.position), str(row.choice), int(row.batch))
                self._table[key] = (float(row.net_ms), float(row.overhead_ms))
                self._layers[key] = int(row.n_layers) if has_layers else 0
        models = profile.doc.get("models", {})
        entry = models.get("latency_composition")
        self.composition = CompositionModel.from_doc(entry, source=f"profile {profile.name!r}") if entry else None
        self._latency = models.get("latency")
        self._energy = models.get("energy")
        load = models.get("load")
        self.load_model = LoadModel(float(load["alpha"]["value"]), float(load["r2"]["value"]),
                                    int(load["n"]["value"])) if load else None
        self._hit_rate: HitRateCurve | None = None

    @property
    def hit_rate(self) -> HitRateCurve:
        if self._hit_rate is None:
            self._hit_rate = HitRateCurve.from_profile(self.profile)
        return self._hit_rate

    @property
    def has_block_table(self) -> bool:
        return bool(self._table)

    def corrects(self, batch: int = 1) -> bool:
        """Whether ``block_sum_ms`` at this batch applies a composition correction."""
        return self.composition is not None and self.composition.batch == batch

    def block_sum_ms(self, pairs: Sequence[tuple[str, str]], *, batch: int = 1) -> float:
        """The variant's predicted latency from the block table: the raw sum, corrected for
        composition when the profile has a correction fitted at this batch."""
        if self.composition is not None and self.composition.batch == batch:
            return self.composition.apply(self.composition_features(pairs, batch=batch))
        return self.raw_block_sum_ms(pairs, batch=batch)

    def composition_features(self, pairs: Sequence[tuple[str, str]], *, batch: int = 1) -> CompositionFeatures:
        """Raw sum, blocks that run operators and their operator count (``composition``)."""
        raw = self.raw_block_sum_ms(pairs, batch=batch)
        layers = [self._layers[(p, c, batch)] for p, c in pairs]
        return CompositionFeatures(raw, sum(1 for n in layers if n > 0), sum(layers))

    def raw_block_sum_ms(self, pairs: Sequence[tuple[str, str]], *, batch: int = 1) -> float:
        """AdaptiveNet's T = sum of table entries (+ the engine's fixed cost once)."""
        if not self._table:
            raise InputError(f"profile {self.profile.name!r} has no block latency table; profile with --supernet")
        missing = [f"{p}/{c}" for p, c in pairs if (p, c, batch) not in self._table]
        if missing:
            raise ModelError(
                f"profile {self.profile.name!r} has no batch-{batch} latency for blocks {', '.join(missing[:8])}"
                + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
                + "; was it profiled with this supernet?"
            )
        entries = [self._table[(p, c, batch)] for p, c in pairs]
        return float(entries[0][1] + sum(net for net, _ in entries))

    def _hit_rates(self, layers: Sequence[LayerFeature]) -> list[float]:
        return [self.hit_rate(f.bytes_moved) for f in layers]

    def eq2_ms(self, layers: Sequence[LayerFeature]) -> float:
        if not self._latency:
            raise InputError(f"profile {self.profile.name!r} has no fitted latency model")
        form = self._latency["form"]
        design, names = latency_design([layers], [self._hit_rates(layers)], form=form)
        return float(design[0] @ _coefficients(self._latency, names))

    def energy(self, layers: Sequence[LayerFeature]) -> tuple[float, str]:
        """(energy, unit): mJ when calibrated, MAC-equivalents otherwise."""
        if not self._energy:
            raise InputError(f"profile {self.profile.name!r} has no energy model")
        shared = len(self._energy["coefficients"]) == 4
        design, names = energy_design([layers], [self._hit_rates(layers)], shared_memory=shared)
        return float(design[0] @ _coefficients(self._energy, names)), str(self._energy["unit"])

    def under_load(self, latency_ms: float, load_index: float) -> float:
        if self.load_model is None:
            return latency_ms
        return latency_ms * self.load_model.factor(load_index)
