"""BN re-estimation in the torch-free runtime equals torch's (recalibrate_bn, momentum None)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from hmt.adapt.bn_export import export_bn_adaptable
from hmt.adapt.bn_runtime import BnReestimator
from hmt.adapt.tent import batch_norms, recalibrate_bn
from tests.adapt.conftest import TinyVariant


def _shifted_batches(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [0.4 * torch.randn(16, 3, 12, 12, generator=g) + 0.7 for _ in range(3)]


def test_runtime_reestimation_equals_torch(tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor],
                                           tmp_path: Path) -> None:
    model, x, _ = tiny_trained
    export_bn_adaptable(model, x[:4], tmp_path / "bn")
    batches = _shifted_batches()

    reference = copy.deepcopy(model)
    recalibrate_bn(reference, batches)
    runtime = BnReestimator(tmp_path / "bn")
    before = [o.copy() for o in runtime.shipped().run(batches[0].numpy())]
    for b in batches:
        runtime.observe(b.numpy())

    stats = [s for g in runtime.graphs for s in runtime.statistics()[g.name]]
    norms = batch_norms(reference)
    assert len(stats) == len(norms) == 2 * 2 + 2  # 4 blocks and 2 exit heads, one BN each
    # The graphs run segment_0, exit_0, segment_1, exit_1; the module registers both
    # segments before both heads.
    seg_norms = [batch_norms(reference.segments[0]), batch_norms(reference.exit_heads[0]),
                 batch_norms(reference.segments[1]), batch_norms(reference.exit_heads[1])]
    flat = [n for group in seg_norms for n in group]
    assert len(flat) == len(stats)
    for (mean, var), bn in zip(stats, flat, strict=True):
        np.testing.assert_allclose(mean, bn.running_mean.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(var, bn.running_var.numpy(), rtol=1e-4, atol=1e-5)

    test = torch.randn(8, 3, 12, 12, generator=torch.Generator().manual_seed(9)) * 0.4 + 0.7
    adapted = runtime.adapted().run(test.numpy())
    with torch.no_grad():
        expected = reference.eval().forward_all(test)
        source = model.eval().forward_all(test)
    np.testing.assert_array_equal(runtime.adapted().run_last(test.numpy()), adapted[-1])
    for got, want, old in zip(adapted, expected, source, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
        assert not np.allclose(got, old.numpy(), atol=1e-3)  # re-estimation changed the outputs
    # The shipped statistics reproduce the source model; reset returns to them.
    with torch.no_grad():
        np.testing.assert_allclose(before[-1], model.eval()(batches[0]).numpy(), rtol=1e-4, atol=1e-4)
    runtime.reset()
    assert runtime.batches == 0


def test_runtime_module_imports_neither_torch_nor_onnx() -> None:
    code = ("import sys; import hmt.adapt.bn_runtime, hmt.adapt.guard, hmt.adapt.drift; "
            "bad = [m for m in ('torch', 'onnx') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
