"""A shift set whose files are well-formed artifacts but hostile data: refused, naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hmt.adapt.bn_export import export_bn_adaptable
from hmt.adapt.guard import GuardPolicy
from hmt.adapt.offline import adapt_runtime, load_sets
from hmt.artifacts import ArtifactWriter
from hmt.errors import ArtifactError, InputError
from tests.adapt.conftest import TinyVariant


def _shift_set(out: Path, labels: Any, images: Any) -> Path:
    """A shift-set artifact with valid checksums over whatever arrays it is given."""
    with ArtifactWriter(out, kind="shift-set", config={}) as writer:
        np.save(writer.path("labels.npy"), labels, allow_pickle=True)
        np.save(writer.path("clean.npy"), images, allow_pickle=True)
        writer.metrics["sets"] = ["clean"]
    return out


def _images(n: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, *shape), dtype=np.uint8)


@pytest.mark.parametrize(("labels", "images", "says"), [
    (np.full(8, -1, dtype=np.int64), _images(8, 3, 12, 12), "labels.npy"),
    (np.full(8, 2.5), _images(8, 3, 12, 12), "labels.npy"),
    (np.zeros((8, 3), dtype=np.int64), _images(8, 3, 12, 12), "labels.npy"),
    (np.array([{"x": 1}] * 8, dtype=object), _images(8, 3, 12, 12), "not a plain .npy"),
    (np.zeros(0, dtype=np.int64), _images(0, 3, 12, 12), "labels.npy"),
    (np.zeros(8, dtype=np.int64), _images(8, 1, 12, 12), "clean.npy"),
    (np.zeros(8, dtype=np.int64), _images(8, 12, 12, 3), "clean.npy"),
])
def test_a_hostile_shift_set_is_refused(tmp_path: Path, labels: Any, images: Any, says: str) -> None:
    # Before: the first five ended in an internal error or adapted on nonsense, the last two
    # (one channel, channels last) were broadcast against the 3-channel normalisation.
    with pytest.raises(ArtifactError, match=says):
        load_sets(_shift_set(tmp_path / "s", labels, images), names=None, limit=None)


def test_labels_outside_cifar10_and_images_the_graphs_do_not_take_are_refused(
        tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor], tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a CIFAR-10 class"):
        load_sets(_shift_set(tmp_path / "a", np.full(8, 999, dtype=np.int64), _images(8, 3, 12, 12)),
                  names=None, limit=None)
    model, _, _ = tiny_trained
    export_bn_adaptable(model, torch.zeros(2, 3, 12, 12), tmp_path / "bn")
    data = load_sets(_shift_set(tmp_path / "b", np.arange(8, dtype=np.int64), _images(8, 3, 8, 8)),
                     names=None, limit=None)
    with pytest.raises(InputError, match=r"images \[3, 8, 8\], but the graphs take \[3, 12, 12\]"):
        adapt_runtime(tmp_path / "bn", data, batch_size=4, guard=GuardPolicy())
