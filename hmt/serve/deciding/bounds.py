"""Bounds across variants on the latency estimates (:mod:`hmt.serve.deciding.estimates`).

A variant measured at the current load says something about the variants the profile ranks
beside it, which is worth more than an extrapolation from a calmer load or a prior. Each
estimate has a source:

- ``measured``: the p95 of a window at this load level;
- ``measured_few``: a floor from a few samples at this level or from the newest samples;
- ``scaled``: measured at another level, scaled by the load model;
- ``prior``: the profile's prediction, scaled.

The last two are extrapolations, and two bounds hold them to what this load measured:

- :func:`cap_by_slower`: never slower than a variant the profile calls slower, measured here;
- :func:`bound_by_faster`: never faster than a variant the profile calls faster, measured here.

They are applied in that order, so where they disagree the cautious one (the higher) wins.
Both walk the variants once in profile order and edit the lists in place: O(variants).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SOURCE_MEASURED = "measured"
SOURCE_SCALED = "scaled"  # measured at another load level, scaled by the load model
SOURCE_PRIOR = "prior"
# Fewer than min_samples at this level, and their lower median is above the scaled or prior estimate.
SOURCE_FEW = "measured_few"


def cap_by_slower(out: list[float], ratios: list[float], sources: Sequence[str], predicted_ms: Sequence[float],
                  by_predicted: Sequence[int], load_scale: float) -> None:
    """A variant judged on an extrapolation (scaled or prior) is never estimated slower than a
    variant the profile calls slower that was measured at this load (its p95 there).

    ``out`` (ms) and ``ratios`` (to the load-scaled prediction) are edited in place; ``by_predicted``
    lists the variants fastest first by the profile. Under a load step, a small variant not served
    since idle is scaled up by the load model from its idle tail, which on a sub-millisecond variant
    is mostly serving overhead that does not grow with the load; the bigger variant serving now
    measured less than that extrapolation, so when nothing fit the fallback judged the bigger
    variant the faster and stayed on it through the whole busy phase (issue 28's burn2 shape,
    per-window trace)."""
    cap = math.inf
    for i in reversed(by_predicted):
        source = sources[i]
        if source == SOURCE_MEASURED:
            if out[i] < cap:
                cap = out[i]
        elif source != SOURCE_FEW and out[i] > cap:
            out[i] = cap
            ratios[i] = cap / (predicted_ms[i] * load_scale)


def bound_by_faster(out: list[float], ratios: list[float], sources: Sequence[str],
                    predicted_ms: Sequence[float], by_predicted: Sequence[int], load_scale: float) -> None:
    """A variant judged on an extrapolation (scaled or prior) is never estimated faster than a
    variant the profile calls faster that was measured at this load (measured or measured_few).

    The load model scales from a calmer level, the measurement says what this load does. Right
    after a load step, the active variant's requests show the step at once while a bigger
    variant's estimate is still scaled from idle; without the bound that bigger variant looked the
    fastest, and the nothing-feasible fallback moved *up* to it (issue 28)."""
    bound = 0.0
    for i in by_predicted:
        source = sources[i]
        if source in (SOURCE_MEASURED, SOURCE_FEW):
            if out[i] > bound:
                bound = out[i]
        elif out[i] < bound:
            out[i] = bound
            ratios[i] = bound / (predicted_ms[i] * load_scale)
