"""TENT lowers entropy on shifted data; the guard refuses a worse model; drift comes and goes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hmt.adapt.drift import DriftMonitor, DriftReference, input_features
from hmt.adapt.guard import GuardPolicy, decide, entropy_np
from hmt.adapt.tent import TentAdapter, TentOptions, entropy
from hmt.errors import UsageError
from tests.adapt.conftest import TinyVariant


def _shift(x: torch.Tensor) -> torch.Tensor:
    # A darker, noisier camera: contrast down, an offset, noise.
    g = torch.Generator().manual_seed(3)
    return 0.5 * x - 0.8 + 0.5 * torch.randn(x.shape, generator=g)


def test_tent_lowers_entropy_on_shifted_data(tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor]) -> None:
    model, x, _ = tiny_trained
    shifted = _shift(x)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapter = TentAdapter(model, TentOptions(lr=3e-2))
    first = adapter.step(shifted).entropy
    for _ in range(10):
        last = adapter.step(shifted).entropy
    assert last < 0.85 * first, (first, last)
    variant = adapter.adapted_variant([shifted])
    with torch.no_grad():
        h_source = entropy(model(shifted)).mean()
        h_adapted = entropy(variant(shifted)).mean()
    assert h_adapted < h_source
    assert not variant.training
    # The source model is never touched.
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_tent_with_memory_saving_engine_follows_plain(
        tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor]) -> None:
    from hmt.adapt.engine import EngineOptions

    model, x, _ = tiny_trained
    shifted = _shift(x)
    curves = []
    for engine in (EngineOptions(compress=False, update_in_backward=False),
                   EngineOptions(compress=True, update_in_backward=True)):
        adapter = TentAdapter(model, TentOptions(lr=3e-2, engine=engine))
        curves.append([adapter.step(shifted).entropy for _ in range(8)])
        adapter.close()
    assert curves[1][-1] < 0.9 * curves[1][0], curves
    assert abs(curves[0][-1] - curves[1][-1]) < 0.05 * curves[0][0], curves


def test_guard_refuses_a_model_worse_on_the_canary_set() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=50)
    good = np.eye(10)[labels] * 4.0
    confidently_wrong = np.eye(10)[(labels + 1) % 10] * 9.0
    recent_before = rng.normal(size=(64, 10))
    recent_after = recent_before * 5.0  # sharper: lower entropy
    decision = decide(recent_logits_before=recent_before, recent_logits_after=recent_after,
                      canary_logits_before=good, canary_logits_after=confidently_wrong, canary_labels=labels)
    assert not decision.accepted and "canary" in decision.reason
    assert decision.entropy_after < decision.entropy_before
    ok = decide(recent_logits_before=recent_before, recent_logits_after=recent_after,
                canary_logits_before=good, canary_logits_after=good, canary_labels=labels)
    assert ok.accepted
    flat = decide(recent_logits_before=recent_before, recent_logits_after=recent_before * 0.5)
    assert not flat.accepted and "entropy" in flat.reason
    assert not decide(recent_logits_before=recent_before, recent_logits_after=recent_after,
                      policy=GuardPolicy(min_entropy_gain=10.0)).accepted
    with pytest.raises(UsageError):
        decide(recent_logits_before=recent_before, recent_logits_after=recent_after, canary_labels=labels)
    # Canary alone: a model whose entropy rose but whose canary accuracy held is kept.
    canary_only = GuardPolicy(require_entropy_drop=False)
    assert decide(recent_logits_before=recent_after, recent_logits_after=recent_before, canary_logits_before=good,
                  canary_logits_after=good, canary_labels=labels, policy=canary_only).accepted
    with pytest.raises(UsageError, match="canary"):
        decide(recent_logits_before=recent_before, recent_logits_after=recent_after, policy=canary_only)


def test_entropy_np_matches_torch() -> None:
    logits = np.random.default_rng(1).normal(size=(7, 10)) * 30
    np.testing.assert_allclose(entropy_np(logits), entropy(torch.from_numpy(logits)).numpy(), rtol=1e-4, atol=1e-6)


def test_drift_starts_on_shifted_inputs_and_ends_when_they_pass() -> None:
    rng = np.random.default_rng(0)
    source = rng.uniform(0, 255, size=(512, 3, 8, 8)).astype(np.uint8)
    reference = DriftReference.from_inputs(source)
    monitor = DriftMonitor(reference, window=32)
    clean = lambda: rng.uniform(0, 255, size=(16, 3, 8, 8)).astype(np.uint8)  # noqa: E731
    events = [monitor.update(clean()) for _ in range(6)]
    assert not any(events) and not monitor.drifting
    events = [monitor.update((clean() * 0.3).astype(np.uint8)) for _ in range(4)]  # darker
    assert [e.kind for e in events if e] == ["drift-start"] and monitor.drifting
    events = [monitor.update(clean()) for _ in range(4)]
    assert [e.kind for e in events if e] == ["drift-end"] and not monitor.drifting
    assert input_features(source).shape == (512, 9)
    with pytest.raises(UsageError):
        DriftMonitor(reference, enter=0.2, leave=0.4)


def test_recalibrate_re_estimates_the_original_networks_statistics_too() -> None:
    # The supernet's calibration keeps layers marked hmt_keep_statistics; test-time adaptation must not.
    from torch import nn

    from hmt.adapt.tent import recalibrate_bn

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5))
    model[1].hmt_keep_statistics = True
    model.eval()
    x = torch.randn(32, 3, 8, 8) * 3 + 2
    recalibrate_bn(model, [x])
    with torch.no_grad():
        h = model[0](x)
    torch.testing.assert_close(model[1].running_mean, h.mean(dim=(0, 2, 3)))
    assert not model.training
