"""Composition correction of the block-table sum, fitted on variants measured end to end.

The block table times each block alone; a variant runs its blocks back to back. The two
differ systematically, and by engine: on a GPU with eager torch a block alone pays its
launch-to-sync latency, which overlaps when blocks run back to back (the sum over-predicts
deep variants by 20-30% on an H100); on ONNX Runtime a variant pays per-run costs (thread
pool wake-up) that the pass-through overhead does not capture. Neither is visible from
the blocks alone, so the correction is fitted on K random variants measured end to end,
drawn from a seed stream of their own and kept apart from the validation variants::

    T = a * raw_ms + b * n_blocks + l * n_layers + c

where ``raw_ms`` is the block-table sum (pass-through overhead once + each block's net
time), ``n_blocks`` the blocks executed that have layers (a skip block runs no operator),
``n_layers`` the operators they contain (on a launch-bound GPU time follows kernel
launches more than the blocks' arithmetic). NNLS on relative error, one trimmed refit
(``fits.nnls_fit``): every coefficient >= 0, so a prediction is never negative and adding
a block never makes a variant predicted faster. (a, b, l, c) = (1, 0, 0, 0) is the raw sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.errors import InputError
from hmt.profile.fits import LinearFit, nnls_fit

COMPOSITION_FORM = "T = a*raw_ms + b*n_blocks + l*n_layers + c"
COMPOSITION_NAMES = ("a_scale", "b_ms_per_block", "l_ms_per_layer", "c_ms")
COMPOSITION_UNITS = {"a_scale": "1", "b_ms_per_block": "ms/block", "l_ms_per_layer": "ms/layer", "c_ms": "ms"}
# Fewer calibration variants than this cannot pin four coefficients and check them (CV).
MIN_CALIBRATION_VARIANTS = 6


@dataclass(frozen=True)
class CompositionFeatures:
    """What the correction sees of a variant: its raw block-table sum and its size."""

    raw_ms: float
    n_blocks: int
    n_layers: int

    def row(self) -> list[float]:
        return [self.raw_ms, float(self.n_blocks), float(self.n_layers), 1.0]


@dataclass(frozen=True)
class CompositionModel:
    """The fitted correction, applied to block-table sums at one batch size."""

    a_scale: float
    b_ms_per_block: float
    l_ms_per_layer: float
    c_ms: float
    batch: int

    def apply(self, features: CompositionFeatures) -> float:
        return float(self.a_scale * features.raw_ms + self.b_ms_per_block * features.n_blocks
                     + self.l_ms_per_layer * features.n_layers + self.c_ms)

    @classmethod
    def from_fit(cls, fit: LinearFit, *, batch: int) -> CompositionModel:
        c = fit.as_dict()
        return cls(c["a_scale"], c["b_ms_per_block"], c["l_ms_per_layer"], c["c_ms"], batch)

    @classmethod
    def from_doc(cls, entry: Mapping[str, Any], *, source: str) -> CompositionModel:
        """From ``models.latency_composition`` of a profile; refuses a malformed entry by name."""
        try:
            coefficients = entry["coefficients"]
            values = [float(coefficients[n]["value"]) for n in COMPOSITION_NAMES]
            batch = int(entry["batch"]["value"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{source}: models.latency_composition lacks or mangles {exc} (needs coefficients "
                             f"{list(COMPOSITION_NAMES)} and batch)") from exc
        if any(v < 0 for v in values) or batch < 1:
            raise InputError(f"{source}: models.latency_composition has a negative coefficient or batch < 1")
        a, b, l_, c = values
        return cls(a, b, l_, c, batch)


def fit_composition(features: Sequence[CompositionFeatures], measured_ms: Sequence[float], *, seed: int = 0,
                    labels: Sequence[str] | None = None) -> LinearFit:
    """NNLS of measured end-to-end latency on the features, relative error, one trimmed refit.

    ``cv_mape`` (5-fold, from 10 variants) is the honest in-calibration error; the
    validation variants, measured separately, are the test.
    """
    if len(features) != len(measured_ms):
        raise ValueError(f"{len(features)} feature rows but {len(measured_ms)} measurements")
    if len(features) < MIN_CALIBRATION_VARIANTS:
        raise ValueError(f"{len(features)} calibration variants cannot fit the composition correction; "
                         f"need >= {MIN_CALIBRATION_VARIANTS}")
    design = np.asarray([f.row() for f in features], float)
    return nnls_fit(design, np.asarray(measured_ms, float), names=COMPOSITION_NAMES, form=COMPOSITION_FORM,
                    relative=True, seed=seed, robust=True, labels=labels)
