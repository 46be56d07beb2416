"""Costs of variants: per-block sums equal whole-variant measurements; profile checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hmt.errors import ArtifactError
from hmt.pareto.objectives import BYTES_PER_MB, ProfilePredictor, VariantCostModel
from hmt.profile import load_profile

from .conftest import NANO, block_table_profile


def test_block_sums_equal_whole_variant(tiny_loaded, tiny_blocks) -> None:  # type: ignore[no-untyped-def]
    from hmt.profile.features import layer_features
    from hmt.profile.fits import energy_design, latency_design
    from hmt.supernet.metrics import measure_cost

    profile = load_profile(NANO)
    predictor = ProfilePredictor(profile, tiny_blocks, tiny_loaded.space)
    model = VariantCostModel(tiny_loaded.net, tiny_blocks, predictor)
    models = profile.doc["models"]
    rng = np.random.default_rng(0)
    for arch in [tiny_loaded.space.largest(), tiny_loaded.space.smallest()] + [
            tiny_loaded.space.sample(rng) for _ in range(4)]:
        costs = model.costs(arch)
        variant = tiny_loaded.net.materialize(arch)
        whole = measure_cost(variant, tiny_loaded.space.input_shape)
        assert (costs.params, costs.macs, costs.activation_peak_bytes) == (
            whole.params, whole.macs, whole.activation_peak_bytes)
        assert costs.memory_mb == pytest.approx((4 * whole.params + whole.activation_peak_bytes) / BYTES_PER_MB)
        layers = layer_features(variant, tiny_loaded.space.input_shape)
        eps = [[predictor.predictor.hit_rate(f.bytes_moved) for f in layers]]
        design, names = latency_design([layers], eps, form=models["latency"]["form"])
        expected_ms = float(design[0] @ [models["latency"]["coefficients"][n]["value"] for n in names])
        assert costs.latency_ms == pytest.approx(expected_ms, rel=1e-9)
        design, names = energy_design([layers], eps)
        expected = float(design[0] @ [models["energy"]["coefficients"][n]["value"] for n in names])
        assert costs.energy == pytest.approx(expected, rel=1e-9)
    assert predictor.energy_unit == "mac_equivalent"


def test_block_table_is_used_and_checked(tiny_loaded, tiny_blocks, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shapes = {pair: block.input_shape for pair, block in tiny_blocks.items()}
    path = block_table_profile(tmp_path / "good.json", shapes, space_tag=tiny_loaded.space.tag)
    predictor = ProfilePredictor(load_profile(path), tiny_blocks, tiny_loaded.space)
    assert predictor.latency_form == "block-table"
    arch = tiny_loaded.space.largest()
    pairs = tiny_loaded.net.variant_blocks(arch)
    assert predictor.predict_latency_ms(pairs) == pytest.approx(predictor.predictor.block_sum_ms(pairs))

    other_tag = block_table_profile(tmp_path / "tag.json", shapes, space_tag="resnet18-abcdef")
    with pytest.raises(ArtifactError, match="measured for supernet space resnet18-abcdef"):
        ProfilePredictor(load_profile(other_tag), tiny_blocks, tiny_loaded.space)

    missing = dict(list(shapes.items())[:-3])
    with pytest.raises(ArtifactError, match="no batch-1 row for"):
        ProfilePredictor(load_profile(block_table_profile(tmp_path / "m.json", missing)), tiny_blocks,
                         tiny_loaded.space)

    wrong = {pair: (s[0] * 2, *s[1:]) for pair, s in shapes.items()}
    with pytest.raises(ArtifactError, match="other input shapes"):
        ProfilePredictor(load_profile(block_table_profile(tmp_path / "w.json", wrong)), tiny_blocks,
                         tiny_loaded.space)
    # --no-block-table falls back on eq. 2 even with a mismatched table.
    fallback = ProfilePredictor(load_profile(tmp_path / "w.json"), tiny_blocks, tiny_loaded.space,
                                use_block_table=False)
    assert fallback.latency_form == "eq2+overhead"


def test_choice_order_is_by_cost(tiny_loaded, tiny_blocks) -> None:  # type: ignore[no-untyped-def]
    predictor = ProfilePredictor(load_profile(NANO), tiny_blocks, tiny_loaded.space)
    model = VariantCostModel(tiny_loaded.net, tiny_blocks, predictor)
    order = model.choice_order(tiny_loaded.space)
    for pos in tiny_loaded.space.positions:
        prices = [predictor.predict_latency_ms([(pos.name, c)]) for c in order[pos.name]]
        assert prices == sorted(prices) and sorted(order[pos.name]) == sorted(pos.choices)
