"""The decoded-array cache: hits are identical and faster, bad entries are rebuilt, writes are atomic."""

from __future__ import annotations

import pickle
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from hmt.data import default_cache_dir, load_dataset
from hmt.data.cache import CACHE_FORMAT_VERSION
from hmt.data.safe_pickle import safe_load_pickle
from hmt.errors import InputError


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.npz"))


def test_cache_hit_is_identical_and_faster(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    start = time.perf_counter()
    cold = load_dataset("cifar10", cache_dir=cache)
    cold_s = time.perf_counter() - start
    (entry,) = _entries(cache)
    assert entry.name.startswith("cifar10-") and entry.name.endswith(f"-v{CACHE_FORMAT_VERSION}.npz")
    assert not list(cache.glob("*.tmp")), "temporary files must be renamed or removed"
    start = time.perf_counter()
    warm = load_dataset("cifar10", cache_dir=cache)
    warm_s = time.perf_counter() - start
    assert warm.info == cold.info
    for name in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(warm, name), getattr(cold, name))
        assert getattr(warm, name).dtype == getattr(cold, name).dtype
    assert warm_s < cold_s / 3, (cold_s, warm_s)


def test_corrupt_cache_entry_is_rebuilt(tmp_path: Path, basicmotions_dir: Path) -> None:
    cache = tmp_path / "cache"
    first = load_dataset("basicmotions", basicmotions_dir, cache_dir=cache)
    (entry,) = _entries(cache)
    blob = bytearray(entry.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    entry.write_bytes(bytes(blob))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = load_dataset("basicmotions", basicmotions_dir, cache_dir=cache)
    assert any("rebuilding" in str(w.message) for w in caught)
    np.testing.assert_array_equal(again.train_x, first.train_x)
    entry.write_bytes(entry.read_bytes()[:1000])  # truncated, as by a full disk
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        np.testing.assert_array_equal(
            load_dataset("basicmotions", basicmotions_dir, cache_dir=cache).test_x, first.test_x
        )
    # The rebuilt entry verifies again: a clean hit raises no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_dataset("basicmotions", basicmotions_dir, cache_dir=cache)


def test_changed_source_misses(tmp_path: Path, basicmotions_dir: Path) -> None:
    folder = tmp_path / "bm"
    folder.mkdir()
    for name in ("BasicMotions_TRAIN.ts", "BasicMotions_TEST.ts"):
        (folder / name).write_bytes((basicmotions_dir / name).read_bytes())
    cache = tmp_path / "cache"
    before = load_dataset("basicmotions", folder, cache_dir=cache)
    (folder / "BasicMotions_TEST.ts").write_text((folder / "BasicMotions_TEST.ts").read_text() + "\n")
    after = load_dataset("basicmotions", folder, cache_dir=cache)
    assert len(_entries(cache)) == 2
    assert after.info.source_sha256 != before.info.source_sha256


def test_moved_source_hits_with_current_path(tmp_path: Path, basicmotions_dir: Path) -> None:
    cache = tmp_path / "cache"
    load_dataset("basicmotions", basicmotions_dir, cache_dir=cache)
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("BasicMotions_TRAIN.ts", "BasicMotions_TEST.ts"):
        (moved / name).write_bytes((basicmotions_dir / name).read_bytes())
    ds = load_dataset("basicmotions", moved, cache_dir=cache)
    assert len(_entries(cache)) == 1 and ds.info.source == str(moved)


def test_unwritable_cache_warns_and_still_loads(tmp_path: Path, basicmotions_dir: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="could not write the data cache"):
        ds = load_dataset("basicmotions", basicmotions_dir, cache_dir=blocker / "cache")
    assert ds.train_x.shape == (40, 6, 100)


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HMT_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "data"
    monkeypatch.delenv("HMT_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "hmt" / "data"


def test_unpickler_refuses_payload_and_keeps_arrays(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(InputError, match=r"evil: pickle refers to (posix|os|nt)\.system"):
        safe_load_pickle(path)
    assert not marker.exists()

    class Eval:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (eval, ("1 + 1",))

    path.write_bytes(pickle.dumps(Eval(), protocol=2))
    with pytest.raises(InputError, match=r"(__builtin__|builtins)\.eval"):
        safe_load_pickle(path)

    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    for protocol in (2, 4, 5):
        path.write_bytes(pickle.dumps({b"data": array, b"labels": [1, 2, 3]}, protocol=protocol))
        loaded = safe_load_pickle(path)
        np.testing.assert_array_equal(loaded[b"data"], array)
    # Pickles from numpy 1.x (and the 2009 CIFAR files) name numpy.core, not numpy._core.
    legacy = pickle.dumps(array, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    path.write_bytes(legacy)
    np.testing.assert_array_equal(safe_load_pickle(path), array)
    path.write_bytes(b"\x80\x02garbage")
    with pytest.raises(InputError, match="evil"):
        safe_load_pickle(path)
