"""The chain runner: early exit by confidence, engine choice, failed loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from serve_bundles import VariantDef, make_bundle

from hmt.bundle import load_bundle
from hmt.errors import ModelError, UsageError
from hmt.serve.running.runner import load_runner, resolve_engine, softmax_confidence

CONFIDENT = np.array([[8.0, 0.0, 0.0, 0.0]], dtype=np.float32)
UNSURE = np.zeros((1, 4), dtype=np.float32)


def test_early_exit_stops_at_the_first_confident_head(bundle_dir: Path) -> None:
    runner = load_runner(load_bundle(bundle_dir), "big")
    runner.warm_up(UNSURE, runs=1)
    sure = runner.run(CONFIDENT, confidence=0.9)
    assert (sure.exit, sure.class_index) == (0, 0) and sure.confidence > 0.99
    assert 0 < sure.predicted_share < 1
    unsure = runner.run(UNSURE, confidence=0.9)
    assert unsure.exit == runner.exit_stage == 1 and unsure.confidence == pytest.approx(0.25)
    assert unsure.predicted_share == pytest.approx(1.0)  # the longest path: every segment and every head
    plain = runner.run(CONFIDENT, confidence=None)  # early exit off: only the last head
    assert plain.exit == 1 and plain.predicted_share == pytest.approx(1.0)


def test_softmax_confidence_is_stable_for_large_logits() -> None:
    cls, conf = softmax_confidence(np.array([1000.0, 0.0, -1000.0]))
    assert cls == 0 and conf == pytest.approx(1.0)
    with pytest.raises(ModelError, match="non-finite"):
        softmax_confidence(np.array([np.nan, 1.0]))


def test_engine_resolution(bundle_dir: Path) -> None:
    variant = load_bundle(bundle_dir).spec.variant("big")
    assert resolve_engine("auto", variant) == "onnxruntime"
    with pytest.raises(UsageError, match="no TVM libraries"):
        resolve_engine("tvm", variant)
    with pytest.raises(UsageError, match="engine must be"):
        resolve_engine("cuda", variant)


def test_corrupt_graph_fails_to_load_with_a_model_error(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b", [VariantDef("bad", 0.9, 1.0, 1.0, broken=True)]))
    with pytest.raises(ModelError, match="segment_0.onnx"):
        load_runner(bundle, "bad")
