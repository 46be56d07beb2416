"""Coefficients are matched to design columns by name, whatever order the JSON holds them in."""

from __future__ import annotations

import copy

from hmt.profile.devices import shipped_profile
from hmt.profile.features import conv_feature
from hmt.profile.predictor import Predictor


def test_eq2_and_energy_do_not_depend_on_stored_order() -> None:
    profile = shipped_profile("jetson-nano")
    layers = [conv_feature("c", c_in=16, c_out=32, kernel=(3, 3), out_spatial=(16, 16), in_spatial=(16, 16))]
    reference_ms = Predictor(profile).eq2_ms(layers)
    reference_energy = Predictor(profile).energy(layers)[0]
    shuffled = copy.deepcopy(profile)
    for model in ("latency", "energy"):
        coefficients = shuffled.doc["models"][model]["coefficients"]
        shuffled.doc["models"][model]["coefficients"] = dict(reversed(list(coefficients.items())))
    assert Predictor(shuffled).eq2_ms(layers) == reference_ms
    assert Predictor(shuffled).energy(layers)[0] == reference_energy
