"""The composition correction of the block-table sum: fit, schema round trip, old profiles."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from hmt.errors import InputError, UsageError
from hmt.profile import ProfileOptions, load_profile, profile_device
from hmt.profile.composition import (
    COMPOSITION_NAMES,
    COMPOSITION_UNITS,
    CompositionFeatures,
    CompositionModel,
    fit_composition,
)
from hmt.profile.predictor import Predictor
from hmt.profile.schema import DeviceProfile, profile_from_doc, profile_to_json_files, quantity, read_profile_json
from hmt.profile.validate import sample_variants, validate_variants

from .test_profile_pipeline import _options

NANO = Path(__file__).resolve().parents[2] / "profiles" / "jetson-nano.json"
# (position, choice) -> (net_ms, n_layers); "skip" runs no operator.
BLOCKS = {("stem", "conv"): (0.11, 2), ("b0", "wide"): (0.37, 3), ("b0", "thin"): (0.13, 2), ("b0", "skip"): (0.0, 0),
          ("b1", "wide"): (0.41, 4), ("b1", "thin"): (0.09, 1), ("exit", "head"): (0.05, 3)}
OVERHEAD_MS = 0.02


def _profile(*, composition: dict[str, Any] | None = None) -> DeviceProfile:
    """The shipped (estimated) Nano profile plus a made-up block table at batch 1 and 4."""
    profile = read_profile_json(NANO)
    rows = [{"position": p, "choice": c, "batch": b, "input_shape": "3x8x8", "net_ms": net * b,
             "overhead_ms": OVERHEAD_MS, "n_layers": layers}
            for b in (1, 4) for (p, c), (net, layers) in BLOCKS.items()]
    profile.add_table("block_latency", pd.DataFrame(rows), units={
        "position": "name", "choice": "name", "batch": "count", "input_shape": "shape", "net_ms": "ms",
        "overhead_ms": "ms", "n_layers": "count"}, source="core")
    if composition is not None:
        profile.doc["provenance"]["fit-composition"] = {"origin": "fitted", "when": "2026-11-26T00:00:00+00:00",
                                                        "how": "test", "inputs": ["block-table"]}
        profile.doc.setdefault("models", {})["latency_composition"] = composition
    return profile


def _composition_doc(a: float, b: float, l_: float, c: float, *, batch: int = 1) -> dict[str, Any]:
    values = dict(zip(COMPOSITION_NAMES, (a, b, l_, c), strict=True))
    return {"form": "T = a*raw_ms + b*n_blocks + l*n_layers + c",
            "coefficients": {n: quantity(v, COMPOSITION_UNITS[n], "fit-composition") for n, v in values.items()},
            "batch": quantity(batch, "count", "fit-composition")}


VARIANTS = [[("stem", "conv"), ("b0", "wide"), ("b1", "wide"), ("exit", "head")],
            [("stem", "conv"), ("b0", "skip"), ("b1", "thin"), ("exit", "head")],
            [("stem", "conv"), ("b0", "thin"), ("exit", "head")]]


def _raw(pairs: list[tuple[str, str]], batch: int = 1) -> float:
    return OVERHEAD_MS + sum(BLOCKS[p][0] * batch for p in pairs)


def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(0)
    truth = (0.62, 0.03, 0.011, 0.05)
    features = [CompositionFeatures(float(rng.uniform(0.2, 3.0)), int(rng.integers(3, 12)), int(rng.integers(8, 70)))
                for _ in range(40)]
    exact = [float(np.dot(f.row(), truth)) for f in features]
    fit = fit_composition(features, exact)
    assert fit.as_dict() == pytest.approx(dict(zip(COMPOSITION_NAMES, truth, strict=True)), rel=1e-6, abs=1e-9)
    # 1% multiplicative noise and one wild measurement (a contended run): the trimmed
    # refit drops it, names it, and the coefficients stay close.
    noisy = [y * (1 + 0.01 * float(rng.standard_normal())) for y in exact]
    noisy[7] *= 3.0
    fit = fit_composition(features, noisy, labels=[f"v{i}" for i in range(40)])
    assert "v7" in " ".join(fit.notes) and fit.n == 39
    got = fit.as_dict()
    assert got["a_scale"] == pytest.approx(truth[0], rel=0.1)
    assert got["l_ms_per_layer"] == pytest.approx(truth[2], rel=0.2)
    model = CompositionModel.from_fit(fit, batch=1)
    assert all(abs(model.apply(f) / y - 1) < 0.05 for f, y in zip(features, exact, strict=True))


def test_fit_keeps_coefficients_non_negative_and_refuses_too_few() -> None:
    # Measured = 0.8 * raw exactly: the extra features get 0, never a negative offset.
    features = [CompositionFeatures(r, n, 4 * n) for r, n in zip(np.linspace(0.1, 2.0, 12), range(2, 14), strict=True)]
    fit = fit_composition(features, [0.8 * f.raw_ms for f in features])
    assert min(fit.coefficients) >= 0 and fit.as_dict()["a_scale"] == pytest.approx(0.8, rel=1e-6)
    with pytest.raises(ValueError, match="need >= 6"):
        fit_composition(features[:5], [1.0] * 5)


def test_profile_without_correction_predicts_exactly_as_before() -> None:
    predictor = Predictor(_profile())
    assert predictor.composition is None and not predictor.corrects(1)
    for pairs in VARIANTS:
        for batch in (1, 4):
            expected = OVERHEAD_MS + sum(BLOCKS[p][0] * batch for p in pairs)  # the old formula, same order
            assert predictor.block_sum_ms(pairs, batch=batch) == predictor.raw_block_sum_ms(pairs, batch=batch)
            assert predictor.block_sum_ms(pairs, batch=batch) == pytest.approx(expected, rel=1e-12)


def test_a_table_without_layer_counts_still_predicts() -> None:
    profile = _profile()
    frame = profile.tables["block_latency"].drop(columns=["n_layers"])
    profile.add_table("block_latency", frame, units={c: "x" for c in frame.columns}, source="core")
    assert Predictor(profile).block_sum_ms(VARIANTS[0]) == pytest.approx(_raw(VARIANTS[0]))


@pytest.mark.parametrize("with_correction", [False, True])
def test_schema_round_trip(with_correction: bool, tmp_path: Path) -> None:
    profile = _profile(composition=_composition_doc(0.7, 0.01, 0.004, 0.03) if with_correction else None)
    for inline in (True, False):
        files = profile_to_json_files(profile, inline=inline)
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
        back = profile_from_doc(json.loads(files["profile.json"]), source="round trip", base_dir=tmp_path)
        assert ("latency_composition" in back.doc.get("models", {})) == with_correction
        before, after = Predictor(profile), Predictor(back)
        assert after.composition == before.composition
        for pairs in VARIANTS:
            assert after.block_sum_ms(pairs) == pytest.approx(before.block_sum_ms(pairs), rel=1e-12)
            assert after.raw_block_sum_ms(pairs) == pytest.approx(_raw(pairs), rel=1e-12)


def test_correction_applies_at_its_batch_only() -> None:
    predictor = Predictor(_profile(composition=_composition_doc(0.7, 0.01, 0.004, 0.03, batch=1)))
    assert predictor.corrects(1) and not predictor.corrects(4)
    pairs = VARIANTS[1]  # stem, skip, thin, head: 3 blocks with layers, 6 layers
    features = predictor.composition_features(pairs)
    assert (features.n_blocks, features.n_layers) == (3, 6)
    assert predictor.block_sum_ms(pairs) == pytest.approx(0.7 * _raw(pairs) + 0.01 * 3 + 0.004 * 6 + 0.03)
    assert predictor.raw_block_sum_ms(pairs) == pytest.approx(_raw(pairs))
    assert predictor.block_sum_ms(pairs, batch=4) == pytest.approx(_raw(pairs, 4))


def test_a_malformed_correction_is_refused_by_name() -> None:
    doc = _composition_doc(0.7, 0.0, 0.0, 0.0)
    del doc["coefficients"]["c_ms"]
    with pytest.raises(InputError, match="latency_composition"):
        Predictor(_profile(composition=doc))
    negative = _composition_doc(0.7, -0.1, 0.0, 0.0)
    with pytest.raises(InputError, match="negative"):
        Predictor(_profile(composition=negative))


def test_pareto_profile_predictor_uses_the_correction() -> None:
    from hmt.pareto.objectives import BlockCost, ProfilePredictor

    blocks = {pair: BlockCost(params=1, macs=1, activation_peak_bytes=4, input_shape=(3, 8, 8), layers=())
              for pair in BLOCKS}
    space = SimpleNamespace(tag="test-space")
    profile = _profile(composition=_composition_doc(0.5, 0.02, 0.0, 0.01))
    predictor = ProfilePredictor(profile, blocks, space)  # type: ignore[arg-type]
    assert predictor.latency_form == "block-table+composition"
    pairs = VARIANTS[0]
    assert predictor.predict_latency_ms(pairs) == pytest.approx(0.5 * _raw(pairs) + 0.02 * 4 + 0.01)
    plain = ProfilePredictor(_profile(), blocks, space)  # type: ignore[arg-type]
    assert plain.latency_form == "block-table" and plain.predict_latency_ms(pairs) == pytest.approx(_raw(pairs))


def test_pipeline_calibrates_apart_from_validation(tmp_path: Path, fast: Any) -> None:
    out = tmp_path / "profile"
    result = profile_device(out, _options(supernet=tmp_path / "supernet", validate=4, calibrate_variants=6,
                                          validate_load_processes=0))
    profile = load_profile(out)
    entry = profile.doc["models"]["latency_composition"]
    assert entry["batch"]["value"] == 1 and set(entry["coefficients"]) == set(COMPOSITION_NAMES)
    assert profile.doc["provenance"][entry["coefficients"]["a_scale"]["source"]]["origin"] == "fitted"
    calibration = profile.table("composition_calibration")
    validation = profile.table("validation")
    assert len(calibration) == 6 and not set(calibration.arch_id) & set(validation.arch_id)
    assert (validation.raw_predicted_ms > 0).all()
    # The validation scored both: corrected (what the predictor now returns) and raw.
    assert set(profile.doc["validation"]) >= {"idle", "idle_raw"} and result.validation.idle_raw is not None
    predictor = Predictor(profile)
    arch = fast.space.largest()
    pairs = fast.net.variant_blocks(arch)
    assert predictor.corrects(1)
    assert predictor.block_sum_ms(pairs) == pytest.approx(predictor.composition.apply(  # type: ignore[union-attr]
        predictor.composition_features(pairs)))
    assert result.summary["models.latency_composition.coefficients.a_scale"] >= 0
    # Without --validate nothing is calibrated by default; with it, 12 unless told.
    assert ProfileOptions().calibration_variants == 0
    assert ProfileOptions(supernet=tmp_path, validate=3).calibration_variants == 12


def test_calibration_option_errors(tmp_path: Path, fast: Any) -> None:
    with pytest.raises(UsageError, match="needs --supernet"):
        profile_device(tmp_path / "p", ProfileOptions(calibrate_variants=8))
    with pytest.raises(UsageError, match=">= 6"):
        profile_device(tmp_path / "p", _options(supernet=tmp_path / "supernet", calibrate_variants=3))
    # The tiny space has 18 variants: calibration takes what exists, and validation then
    # draws only from the rest (here nothing is left, which is refused by name).
    calibration = sample_variants(fast.space, 40, np.random.default_rng(0))
    assert len(calibration) == 18
    ids = frozenset(a.arch_id for a in calibration)
    assert sample_variants(fast.space, 5, np.random.default_rng(1), exclude=ids) == []
    with pytest.raises(UsageError, match="no validation variants"):
        validate_variants(fast.net, fast.space, Predictor(_profile()), None, n=3,  # type: ignore[arg-type]
                          rng=np.random.default_rng(0), exclude=ids)


def test_old_profile_document_loads_unchanged() -> None:
    """A profile written before the correction existed (no models.latency_composition,
    no raw column in validation) loads and predicts with the raw sum."""
    profile = _profile()
    doc = copy.deepcopy(json.loads(profile_to_json_files(profile, inline=True)["profile.json"]))
    back = profile_from_doc(doc, source="old")
    assert Predictor(back).block_sum_ms(VARIANTS[2]) == pytest.approx(_raw(VARIANTS[2]), rel=1e-12)
