"""A damaged .npz given to serve or deploy (--canary, --data, --canary-data, --blocks-data) is bad input
(one line naming the file, exit 3 or 2), not an internal error: numpy raises zipfile's and zlib's errors
for a truncated copy or a flipped byte, which the readers did not catch (exit 70)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hmt.bundle import load_bundle
from hmt.errors import InputError, UsageError


def _damaged(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.npz"
    np.savez_compressed(good, x=np.zeros((4, 3, 8, 8), np.float32), y=np.zeros(4, np.int64))
    data = good.read_bytes()
    flipped = bytearray(data)
    for at in range(60, len(flipped) - 60, 37):
        flipped[at] ^= 0xFF
    files = {"garbage": b"PK\x03\x04 not a zip at all", "truncated": data[: len(data) // 2],
             "flipped": bytes(flipped)}
    out = {}
    for name, content in files.items():
        out[name] = tmp_path / f"{name}.npz"
        out[name].write_bytes(content)
    return out


def _readers(bundle_dir: Path) -> dict[str, tuple[Callable[[Path], Any], type[Exception]]]:
    from hmt.deploy.adaptable import ship_canary
    from hmt.deploy.blocks import read_labelled
    from hmt.serve.running.adapt import load_canary
    from hmt.serve.running.session import load_inputs

    bundle = load_bundle(bundle_dir)
    writer: Any = None  # never reached: the file is read first
    return {
        "serve --canary": (lambda p: load_canary(p, bundle), InputError),
        "serve --data": (lambda p: load_inputs(bundle, p, np.random.default_rng(0)), InputError),
        "deploy --canary-data": (lambda p: ship_canary(writer, p, seed=0), UsageError),
        "deploy --blocks-data": (lambda p: read_labelled(p, (3, 8, 8), seed=0, max_samples=8), UsageError),
    }


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped"])
@pytest.mark.parametrize("reader", ["serve --canary", "serve --data", "deploy --canary-data", "deploy --blocks-data"])
def test_a_damaged_npz_is_bad_input_naming_the_file(bundle_dir: Path, tmp_path: Path, damage: str,
                                                    reader: str) -> None:
    path = _damaged(tmp_path)[damage]
    read, error = _readers(bundle_dir)[reader]
    with pytest.raises(error) as err:
        read(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
