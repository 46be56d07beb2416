"""CIFAR-10-C-style corruptions: seeded, shaped like the input, stronger with severity; the
shift-set artifact is verified when loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hmt.adapt.corruptions import CORRUPTIONS, corrupt, disk_kernel, load_shift_set, write_shift_set
from hmt.errors import ArtifactError, UsageError


def _images(n: int = 6) -> np.ndarray:
    rng = np.random.default_rng(0)
    base = rng.uniform(40, 215, size=(n, 3, 1, 1))
    texture = rng.normal(0, 25, size=(n, 3, 32, 32))
    return np.clip(base + texture, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruption_is_seeded_shaped_and_grows_with_severity(name: str) -> None:
    x = _images()
    s3 = corrupt(x, name, 3, np.random.default_rng(1))
    s5 = corrupt(x, name, 5, np.random.default_rng(1))
    assert s5.dtype == np.uint8 and s5.shape == x.shape
    np.testing.assert_array_equal(s3, corrupt(x, name, 3, np.random.default_rng(1)))
    d3 = np.abs(s3.astype(float) - x).mean()
    d5 = np.abs(s5.astype(float) - x).mean()
    assert 0 < d3 < d5, (d3, d5)


def test_defocus_kernel_is_a_normalised_disk() -> None:
    kernel = disk_kernel(1.5, 0.1)
    assert kernel.shape == (17, 17)
    assert kernel.sum() == pytest.approx(1.0)
    assert kernel[8, 8] == kernel.max() and kernel[0, 0] == 0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(UsageError, match="unknown corruption"):
        corrupt(_images(), "fog", 3, np.random.default_rng(0))
    with pytest.raises(UsageError, match="severity"):
        corrupt(_images(), "contrast", 6, np.random.default_rng(0))


def test_shift_set_round_trip_and_tamper_detection(tmp_path: Path) -> None:
    x = _images(10)
    y = np.arange(10, dtype=np.int64)
    names = write_shift_set(tmp_path / "c", x, y, corruptions=["contrast", "gaussian_noise"], severities=[5],
                            seed=7, source={"dataset": "test"})
    assert names == ["contrast-s5", "gaussian_noise-s5"]
    loaded = load_shift_set(tmp_path / "c")
    assert list(loaded.sets) == ["clean", "contrast-s5", "gaussian_noise-s5"]
    np.testing.assert_array_equal(loaded.sets["clean"], x)
    np.testing.assert_array_equal(loaded.labels, y)
    # One set rebuilt alone is identical: each draws from its own seeded generator.
    write_shift_set(tmp_path / "d", x, y, corruptions=["gaussian_noise"], severities=[5], seed=7, source={})
    np.testing.assert_array_equal(load_shift_set(tmp_path / "d").sets["gaussian_noise-s5"],
                                  loaded.sets["gaussian_noise-s5"])
    # Made by parallel processes: the same bytes.
    write_shift_set(tmp_path / "e", x, y, corruptions=["contrast", "gaussian_noise"], severities=[5], seed=7,
                    source={}, workers=2)
    for name in names:
        np.testing.assert_array_equal(load_shift_set(tmp_path / "e").sets[name], loaded.sets[name])
    with pytest.raises(UsageError, match="holds no set"):
        load_shift_set(tmp_path / "c", names=["fog-s5"])
    path = tmp_path / "c" / "contrast-s5.npy"
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ArtifactError, match="contrast-s5.npy"):
        load_shift_set(tmp_path / "c")
