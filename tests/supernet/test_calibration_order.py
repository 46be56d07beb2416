"""BN re-estimation sees mixed batches, whatever order the calibration samples are stored in,
and runs everything but the re-estimated BN layers in eval mode (a dropout inside a block
drops nothing while the statistics after it are measured)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hmt.supernet.calibrate import mixed, recalibrate_bn


def _class_ordered(per_class: int = 256, classes: int = 8) -> np.ndarray:
    """Samples stored class by class, as a dataset stored that way gives them: each class its own mean."""
    rng = np.random.default_rng(1)
    return np.concatenate([rng.normal(3.0 * c, 1.0, size=(per_class, 4)) for c in range(classes)]).astype(np.float32)


def _running_var(samples: np.ndarray, batch: int) -> np.ndarray:
    norm = nn.BatchNorm1d(4)
    recalibrate_bn(norm, [torch.from_numpy(samples[i:i + batch]) for i in range(0, len(samples), batch)],
                   keep_original=False)
    return norm.running_var.numpy()


def test_mixed_is_a_fixed_permutation() -> None:
    x = np.arange(1000)
    once, again = mixed(x), mixed(x)
    assert np.array_equal(once, again)
    assert sorted(once.tolist()) == x.tolist()
    assert not np.array_equal(once, x)


def test_class_ordered_batches_miss_the_variance_mixed_ones_keep() -> None:
    x = _class_ordered()
    true_var = x.var(axis=0, ddof=1)
    ordered = _running_var(x, 256)  # one class per batch: only the within-class variance (about 1)
    mixed_var = _running_var(mixed(x), 256)
    assert np.all(ordered < 0.1 * true_var)
    assert np.allclose(mixed_var, true_var, rtol=0.1)


def test_every_batch_of_a_mixed_class_ordered_set_holds_most_classes() -> None:
    labels = np.repeat(np.arange(10), 205)
    batches = [mixed(labels)[i:i + 256] for i in range(0, len(labels), 256)]
    assert all(len(set(b.tolist())) == 10 for b in batches if len(b) == 256)


def test_dropout_before_a_recalibrated_norm_stays_off() -> None:
    """A user's block with dropout before a BN the variant re-estimates: the statistics are
    those of the eval-mode network, the same from one materialisation to the next."""
    torch.manual_seed(0)
    with_dropout = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Dropout2d(0.5), nn.BatchNorm2d(8), nn.Dropout(0.5),
                                 nn.BatchNorm2d(8))
    without = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Identity(), nn.BatchNorm2d(8), nn.Identity(), nn.BatchNorm2d(8))
    without.load_state_dict(with_dropout.state_dict())
    with_dropout.eval()
    batches = [torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    recalibrate_bn(with_dropout, batches)
    recalibrate_bn(without, batches)
    for index in (2, 4):
        got, want = with_dropout[index], without[index]
        assert isinstance(got, nn.BatchNorm2d) and isinstance(want, nn.BatchNorm2d)
        assert torch.equal(got.running_mean, want.running_mean) and torch.equal(got.running_var, want.running_var)
    assert not with_dropout.training  # left as it was
