"""The serve hook: drift starts -> BN statistics re-estimated -> guarded swap -> reset when it passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hmt.adapt.bn_export import export_bn_adaptable
from hmt.adapt.guard import GuardPolicy
from hmt.adapt.online import OnlineBnAdapter
from tests.adapt.conftest import TinyVariant


def test_online_adapter_adapts_during_drift_and_resets_after(
        tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor], tmp_path: Path) -> None:
    model, x, _ = tiny_trained
    export_bn_adaptable(model, x[:2], tmp_path / "bn", source_inputs=x)
    adapter = OnlineBnAdapter(tmp_path / "bn", window=32, adapt_after=48, min_batch=16)
    g = torch.Generator().manual_seed(5)

    def clean() -> np.ndarray:
        return x[torch.randint(0, len(x), (16,), generator=g)].numpy()

    def darker() -> np.ndarray:
        return (0.3 * x[torch.randint(0, len(x), (16,), generator=g)] - 1.0).numpy()

    events = [e.kind for _ in range(4) for e in adapter.observe(clean())]
    assert events == [] and adapter.active is None
    events = [e.kind for _ in range(8) for e in adapter.observe(darker())]
    assert events[0] == "drift-start" and "adapted" in events, events
    assert adapter.active is not None
    shifted = darker()
    with torch.no_grad():
        source_entropy = torch.special.entr(torch.softmax(model(torch.from_numpy(shifted)), 1)).sum(1).mean()
    logits = adapter.active.run(shifted)[-1]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert float((-(p * np.log(p + 1e-12)).sum(1)).mean()) < float(source_entropy)
    events = [e.kind for _ in range(6) for e in adapter.observe(clean())]
    assert events == ["reset"] and adapter.active is None and adapter.reestimator.batches == 0


def test_online_adapter_refuses_when_canary_gets_worse(
        tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor], tmp_path: Path) -> None:
    model, x, y = tiny_trained
    export_bn_adaptable(model, x[:2], tmp_path / "bn", source_inputs=x)
    # A canary of clean labelled images: statistics of the darker inputs hurt them.
    adapter = OnlineBnAdapter(tmp_path / "bn", window=32, adapt_after=48, min_batch=16,
                              guard=GuardPolicy(canary_tolerance=0.0), canary=(x.numpy(), y.numpy()))
    events = [e for _ in range(8) for e in adapter.observe((0.3 * x[:16] - 1.0).numpy())]
    refused = [e for e in events if e.kind == "refused"]
    assert refused and "canary" in refused[0].detail and adapter.active is None
