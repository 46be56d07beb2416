"""BatchLoader: shapes, normalisation, augmentation, DDP shards, epoch reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hmt.data import BatchLoader, Dataset
from hmt.errors import UsageError


def _loader(ds: Dataset, **overrides: object) -> BatchLoader:
    options: dict[str, object] = {
        "info": ds.info,
        "batch_size": 64,
        "device": "cpu",
        "augment": False,
        "shuffle": True,
        "generator": torch.Generator().manual_seed(1),
    }
    options.update(overrides)
    return BatchLoader(ds.train_x, ds.train_y, **options)  # type: ignore[arg-type]


def _epoch(loader: BatchLoader) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*loader, strict=True)
    return torch.cat(xs), torch.cat(ys)


def test_image_batches_shapes_and_normalisation(embedded_cifar: Dataset) -> None:
    loader = _loader(embedded_cifar, batch_size=300)
    assert len(loader) == 7  # ceil(2000 / 300)
    batches = list(loader)
    assert [len(y) for _, y in batches] == [300] * 6 + [200]
    xb, yb = batches[0]
    assert xb.shape == (300, 3, 32, 32) and xb.dtype == torch.float32 and yb.dtype == torch.int64
    order = loader.epoch_indices(0)
    raw = torch.from_numpy(embedded_cifar.train_x[order[:300]]).float() / 255
    mean = torch.tensor(embedded_cifar.info.mean).view(1, 3, 1, 1)
    std = torch.tensor(embedded_cifar.info.std).view(1, 3, 1, 1)
    torch.testing.assert_close(xb, (raw - mean) / std, rtol=1e-5, atol=1e-5)
    assert yb.tolist() == embedded_cifar.train_y[order[:300]].tolist()
    assert len(_loader(embedded_cifar, batch_size=300, drop_last=True)) == 6


def _matches_a_crop(augmented: torch.Tensor, original: torch.Tensor) -> bool:
    padded = F.pad(original[None].float(), (4, 4, 4, 4), mode="reflect")[0]
    for dy in range(9):
        for dx in range(9):
            crop = padded[:, dy : dy + 32, dx : dx + 32]
            if torch.equal(crop, augmented) or torch.equal(crop.flip(2), augmented):
                return True
    return False


def test_augmentation_is_a_reflect_padded_crop_or_flip(embedded_cifar: Dataset) -> None:
    plain = _loader(embedded_cifar, batch_size=32)
    augmented = _loader(embedded_cifar, batch_size=32, augment=True)
    x_plain, y_plain = next(iter(plain))
    x_aug, y_aug = next(iter(augmented))
    assert torch.equal(y_plain, y_aug), "augmentation must not change the order or the labels"
    assert not torch.allclose(x_plain, x_aug)
    info = embedded_cifar.info
    std = torch.tensor(info.std).view(3, 1, 1)
    mean = torch.tensor(info.mean).view(3, 1, 1)
    order = augmented.epoch_indices(0)
    for k in range(16):
        pixels = ((x_aug[k] * std + mean) * 255).round()
        assert _matches_a_crop(pixels, torch.from_numpy(embedded_cifar.train_x[order[k]]))


def test_channels_last(embedded_cifar: Dataset) -> None:
    for augment in (False, True):
        loader = _loader(embedded_cifar, channels_last=True, augment=augment)
        xb, _ = next(iter(loader))
        assert xb.is_contiguous(memory_format=torch.channels_last)
    xa, _ = next(iter(_loader(embedded_cifar, channels_last=True, augment=True)))
    xb, _ = next(iter(_loader(embedded_cifar, channels_last=False, augment=True)))
    torch.testing.assert_close(xa, xb)


def test_sequence_batches_and_shift(basicmotions: Dataset) -> None:
    plain = _loader(basicmotions, batch_size=16, shuffle=False)
    xb, yb = next(iter(plain))
    assert xb.shape == (16, 6, 100) and yb.tolist() == basicmotions.train_y[:16].tolist()
    mean = torch.tensor(basicmotions.info.mean, dtype=torch.float32).view(1, 6, 1)
    std = torch.tensor(basicmotions.info.std, dtype=torch.float32).view(1, 6, 1)
    torch.testing.assert_close(xb, (torch.from_numpy(basicmotions.train_x[:16]) - mean) / std)
    shifted, ys = next(iter(_loader(basicmotions, batch_size=16, shuffle=False, augment=True)))
    assert torch.equal(ys, yb) and not torch.equal(shifted, xb)
    # Every augmented series is a shifted copy: its middle matches the original at some lag.
    for k in range(16):
        assert any(torch.allclose(shifted[k, :, 20:80], xb[k, :, 20 + lag : 80 + lag]) for lag in range(-10, 11))


def test_ddp_shards_are_disjoint_and_cover(embedded_cifar: Dataset) -> None:
    world = 4
    shards = [_loader(embedded_cifar, rank=r, world_size=world, batch_size=100) for r in range(world)]
    for loader in shards:
        loader.set_epoch(3)
    indices = [loader.epoch_indices() for loader in shards]
    assert {len(i) for i in indices} == {500} and {len(loader) for loader in shards} == {5}
    union = np.concatenate(indices)
    assert len(np.unique(union)) == 2000
    labels = torch.cat([_epoch(loader)[1] for loader in shards])
    assert sorted(labels.tolist()) == sorted(embedded_cifar.train_y.tolist())


def test_ddp_uneven_split_pads_like_distributed_sampler(basicmotions: Dataset) -> None:
    world = 3  # 40 samples: 14 per rank, 2 repeated
    indices = [_loader(basicmotions, rank=r, world_size=world, batch_size=5).epoch_indices(0) for r in range(world)]
    assert {len(i) for i in indices} == {14}
    union = np.concatenate(indices)
    assert set(union.tolist()) == set(range(40)) and len(union) - len(np.unique(union)) == 2
    dropped = [
        _loader(basicmotions, rank=r, world_size=world, batch_size=5, drop_last=True).epoch_indices(0)
        for r in range(world)
    ]
    flat = np.concatenate(dropped)
    assert {len(i) for i in dropped} == {13} and len(np.unique(flat)) == len(flat) == 39


def test_set_epoch_reproduces_order_and_augmentation(embedded_cifar: Dataset) -> None:
    loader = _loader(embedded_cifar, augment=True, batch_size=500)
    epochs = [_epoch(loader) for _ in range(3)]
    assert loader.epoch == 3
    assert not torch.equal(epochs[0][1], epochs[1][1])
    resumed = _loader(embedded_cifar, augment=True, batch_size=500)
    resumed.set_epoch(1)
    x1, y1 = _epoch(resumed)
    assert torch.equal(x1, epochs[1][0]) and torch.equal(y1, epochs[1][1])
    # The seed, not the generator's running state, decides: a used generator gives the same order.
    used = torch.Generator().manual_seed(1)
    torch.rand(10, generator=used)
    np.testing.assert_array_equal(_loader(embedded_cifar, generator=used).epoch_indices(2), loader.epoch_indices(2))
    other = _loader(embedded_cifar, generator=torch.Generator().manual_seed(2))
    assert not np.array_equal(other.epoch_indices(0), loader.epoch_indices(0))


def test_no_shuffle_keeps_order(embedded_cifar: Dataset) -> None:
    loader = _loader(embedded_cifar, shuffle=False)
    np.testing.assert_array_equal(loader.epoch_indices(5), np.arange(2000))


def test_bad_options(embedded_cifar: Dataset, basicmotions: Dataset) -> None:
    with pytest.raises(UsageError, match="batch_size"):
        _loader(embedded_cifar, batch_size=0)
    with pytest.raises(UsageError, match="rank"):
        _loader(embedded_cifar, rank=2, world_size=2)
    with pytest.raises(UsageError, match="channels_last"):
        _loader(basicmotions, channels_last=True)
    with pytest.raises(UsageError, match="uint8"):
        BatchLoader(
            embedded_cifar.train_x.astype(np.float32),
            embedded_cifar.train_y,
            info=embedded_cifar.info,
            batch_size=8,
            device="cpu",
            augment=False,
            shuffle=False,
            generator=torch.Generator(),
        )
