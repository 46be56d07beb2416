"""The memory-saving engine: same gradients as plain autograd (within tolerance), less memory."""

from __future__ import annotations

import copy

import pytest
import torch

from hmt.adapt.engine import EngineOptions, TrainingEngine
from hmt.adapt.memory import (
    Int8SavedTensors,
    as_chain,
    dequantize_u8,
    peak_bytes,
    plan_checkpoints,
    quantize_u8,
    run_chain,
)
from hmt.adapt.tent import configure_for_tent, entropy
from hmt.errors import BudgetError
from tests.adapt.conftest import TinyVariant


def _loss(logits: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([entropy(t).mean() for t in logits]).mean()


def _model_and_batch(batch: int = 16, blocks: int = 3) -> tuple[TinyVariant, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyVariant(width=16, blocks=blocks)
    x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return model, x


def _grads(model: TinyVariant, x: torch.Tensor, *, compress: bool,
           runs: tuple[tuple[int, int], ...]) -> list[torch.Tensor]:
    model = copy.deepcopy(model)
    params = configure_for_tent(model)
    chain = as_chain(model)
    exclude = [*model.parameters(), *model.buffers()]
    with torch.enable_grad():
        if compress:
            with Int8SavedTensors(exclude):
                logits = run_chain(chain, x, runs, compress=True)
        else:
            logits = run_chain(chain, x, runs)
        _loss(logits).backward()
    return [p.grad.clone() for p in params]  # type: ignore[union-attr]


def test_quantize_round_trip_error_is_half_a_step() -> None:
    t = torch.randn(4, 8, 5, 5)
    packed = quantize_u8(t)
    assert packed.q.dtype == torch.uint8
    step = packed.scale.expand_as(t)
    assert torch.all((dequantize_u8(packed) - t).abs() <= step / 2 + 1e-6)


def test_checkpointed_backward_equals_plain() -> None:
    model, x = _model_and_batch()
    plain = _grads(model, x, compress=False, runs=())
    ckpt = _grads(model, x, compress=False, runs=((0, 2), (2, 3), (3, 5)))
    for a, b in zip(plain, ckpt, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_compressed_and_checkpointed_backward_within_tolerance_of_plain() -> None:
    model, x = _model_and_batch()
    plain = torch.cat(_grads(model, x, compress=False, runs=()))
    saved = torch.cat(_grads(model, x, compress=True, runs=((1, 3), (4, 6))))
    cosine = torch.nn.functional.cosine_similarity(plain, saved, dim=0)
    relative = (plain - saved).norm() / plain.norm()
    assert cosine > 0.99, float(cosine)
    assert relative < 0.1, float(relative)


def test_recomputation_does_not_count_a_batch_twice_in_running_stats() -> None:
    model, x = _model_and_batch()
    params = configure_for_tent(model)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = 0.5
    reference = copy.deepcopy(model)
    _loss(run_chain(as_chain(reference), x)).backward()
    _loss(run_chain(as_chain(model), x, ((0, 2), (3, 5)))).backward()
    for a, b in zip(model.buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(a, b)
    assert params


def test_update_in_backward_equals_one_step_after_backward() -> None:
    model, x = _model_and_batch()
    results = []
    for in_backward in (False, True):
        m = copy.deepcopy(model)
        params = configure_for_tent(m)
        engine = TrainingEngine(m, params, lambda ps: torch.optim.SGD(ps, lr=0.1),
                                EngineOptions(compress=False, update_in_backward=in_backward))
        engine.step(x, _loss)
        engine.close()
        assert all(p.grad is None for p in params)
        results.append(torch.cat([p.detach().flatten() for p in params]))
    torch.testing.assert_close(results[0], results[1])
    assert not torch.equal(results[0], torch.cat([p.detach().flatten() for p in configure_for_tent(model)]))


def test_engine_lowers_peak_memory_against_plain_autograd() -> None:
    # Deep enough that saved activations, not the few transient ones, set the peak.
    model, x = _model_and_batch(batch=32, blocks=8)

    def peak(options: EngineOptions) -> int:
        m = copy.deepcopy(model)
        params = configure_for_tent(m)
        engine = TrainingEngine(m, params, lambda ps: torch.optim.Adam(ps, lr=1e-3), options)
        engine.step(x, _loss)  # plans the checkpoints outside the measured call
        result = peak_bytes(lambda: engine.step(x, _loss))
        engine.close()
        return result

    plain = peak(EngineOptions(compress=False, update_in_backward=False))
    probe = plan_checkpoints(as_chain(model), x, None, compress=True,
                             exclude=[*model.parameters(), *model.buffers()])
    compressed = peak(EngineOptions(compress=True))
    budget = int(probe.estimated_bytes * 0.7)
    recomputed = peak(EngineOptions(compress=True, budget_bytes=budget))
    assert plan_checkpoints(as_chain(model), x, budget, compress=True,
                            exclude=[*model.parameters(), *model.buffers()]).runs
    assert compressed < 0.6 * plain, (compressed, plain)
    assert recomputed < compressed, (recomputed, compressed)


def test_budget_below_what_recomputation_can_reach_is_refused() -> None:
    model, x = _model_and_batch()
    configure_for_tent(model)
    with pytest.raises(BudgetError, match="budget"):
        plan_checkpoints(as_chain(model), x, 1024, compress=True, exclude=list(model.parameters()))


def test_saved_activations_are_released_with_the_graph_and_metered() -> None:
    import gc
    import weakref

    from hmt.adapt.memory import Int8SavedTensors, SavedTensorMeter

    x = torch.randn(8, 16, 16, 16, requires_grad=True)
    for compress in (False, True):
        meter = SavedTensorMeter()
        with Int8SavedTensors([], compress=compress, meter=meter):
            y = torch.relu(x * 2.0)  # ReLU saves its own output: the case that made a cycle
        alive = weakref.ref(y)
        assert meter.live_bytes > 0
        y.sum().backward()
        del y
        gc.collect()
        assert alive() is None and meter.live_bytes == 0, compress
        # 8-bit keeps a quarter of the bytes (plus per-channel scale and offset).
        assert meter.peak_bytes <= (0.3 if compress else 1.0) * 2 * x.numel() * 4
