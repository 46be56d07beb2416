"""adapt_set: a shifted set's accuracy recovers with BN re-estimation and TENT; the source is untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hmt.adapt.run import AdaptOptions, adapt_set, balanced_split
from hmt.adapt.tent import TentOptions
from tests.adapt.conftest import TinyVariant


@pytest.mark.parametrize("method", ["bn", "tent"])
def test_adapt_set_recovers_accuracy_on_shifted_data(
        tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor], method: str) -> None:
    model, x, y = tiny_trained
    g = torch.Generator().manual_seed(11)
    shifted = 0.3 * x - 1.5 + 0.2 * torch.randn(x.shape, generator=g)
    options = AdaptOptions(method=method, batch_size=25, tent=TentOptions(lr=1e-2), canary_size=20)
    result, variant = adapt_set(model, "dark", shifted, y.numpy(), options)
    assert result.images == 80 and result.accuracy_after > result.accuracy_before + 0.1, result
    assert (result.accuracy_online is None) == (method == "bn")
    assert result.canary_accuracy_before is not None and result.canary_accuracy_after is not None
    assert result.adapt_ms_per_batch > 0
    assert variant is not model and not variant.training


def test_balanced_split_takes_each_class_alike() -> None:
    labels = np.repeat(np.arange(5), 10)
    held, rest = balanced_split(labels, 10)
    assert np.bincount(labels[held]).tolist() == [2] * 5
    assert len(rest) == 40 and not set(held) & set(rest)
