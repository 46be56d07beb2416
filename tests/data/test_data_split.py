"""Stratified, seeded train/val splits."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.data import Dataset, Split, split_train_val, stratified_indices
from hmt.errors import UsageError


def test_split_is_stratified_disjoint_and_covering(embedded_cifar: Dataset) -> None:
    train, val = split_train_val(embedded_cifar, 0.1, np.random.default_rng(0))
    assert isinstance(train, Split) and isinstance(val, Split)
    assert np.bincount(val.y, minlength=10).tolist() == [20] * 10
    assert np.bincount(train.y, minlength=10).tolist() == [180] * 10
    assert len(train.x) + len(val.x) == len(embedded_cifar.train_x)
    keep, held = stratified_indices(embedded_cifar.train_y, 0.1, np.random.default_rng(0))
    assert not set(keep) & set(held) and len(set(keep) | set(held)) == 2000
    np.testing.assert_array_equal(val.x, embedded_cifar.train_x[held])


def test_split_seeded(embedded_cifar: Dataset) -> None:
    data = (embedded_cifar.train_x, embedded_cifar.train_y)
    first = split_train_val(data, 0.2, np.random.default_rng(7))[1]
    same = split_train_val(data, 0.2, np.random.default_rng(7))[1]
    other = split_train_val(data, 0.2, np.random.default_rng(8))[1]
    np.testing.assert_array_equal(first.x, same.x)
    assert not np.array_equal(first.x, other.x)


def test_split_edges() -> None:
    x = np.arange(10)
    y = np.array([0] * 7 + [1] * 3, dtype=np.int64)
    train, val = split_train_val((x, y), 0.0, np.random.default_rng(0))
    assert len(val.x) == 0 and train.x.tolist() == x.tolist()
    with pytest.raises(UsageError, match="val_fraction"):
        split_train_val((x, y), 1.0, np.random.default_rng(0))
    with pytest.raises(UsageError, match="samples"):
        split_train_val((x, y[:5]), 0.5, np.random.default_rng(0))
