"""Stratified, seeded splits."""

from __future__ import annotations

import numpy as np

from hmt.data.types import Dataset, Split
from hmt.errors import UsageError


def stratified_indices(y: np.ndarray, held_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, held out), each sorted; every class gives ``round(n_c * held_fraction)``.

    Per-class rounding keeps class proportions equal in both parts (the point of
    stratifying) at the cost of the held-out total differing from ``round(N * f)`` by at
    most half the number of classes. Classes are visited in sorted order, so the same
    ``rng`` state always gives the same split.
    """
    if not 0.0 <= held_fraction < 1.0:
        raise UsageError(f"held-out fraction {held_fraction} is out of range; expected 0 <= fraction < 1")
    y = np.asarray(y)
    if y.ndim != 1:
        raise UsageError(f"labels have shape {y.shape}; expected a 1-D array")
    held: list[np.ndarray] = []
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        count = round(len(members) * held_fraction)
        held.append(rng.permutation(members)[:count])
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    mask = np.ones(len(y), dtype=bool)
    mask[held_idx] = False
    return np.flatnonzero(mask), held_idx


def split_train_val(
    data: Dataset | Split | tuple[np.ndarray, np.ndarray], val_fraction: float, rng: np.random.Generator
) -> tuple[Split, Split]:
    """Split the training part into (train, val) ``Split`` pairs, stratified by class.

    ``data`` is a ``Dataset`` (its train split is divided; the test split is never
    touched) or an ``(x, y)`` pair. Samples keep their original order inside each part.
    ``val_fraction`` 0 gives an empty val part. The same ``rng`` seed gives the same split.
    """
    x, y = (data.train_x, data.train_y) if isinstance(data, Dataset) else data
    if len(x) != len(y):
        raise UsageError(f"x has {len(x)} samples but y has {len(y)}")
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"val_fraction {val_fraction} is out of range; expected 0 <= val_fraction < 1")
    keep, held = stratified_indices(y, val_fraction, rng)
    return Split(x[keep], y[keep]), Split(x[held], y[held])
