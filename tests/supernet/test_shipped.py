"""The supernet shipped with the project (issue 11): verified load, the original exact, and
accuracy on the embedded test images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hmt.data import eval_loader, load_dataset
from hmt.errors import ArtifactError
from hmt.supernet import load_supernet
from hmt.supernet.train.evaluate import evaluate_variant

SHIPPED = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"


def test_shipped_supernet_is_small_and_verified(tmp_path: Path) -> None:
    size_bytes = sum(f.stat().st_size for f in SHIPPED.iterdir())
    assert size_bytes <= 10 * 1024 * 1024
    loaded = load_supernet(SHIPPED)
    assert loaded.space.backbone == "cifar_resnet56"
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED, copy)
    (copy / "space.json").write_text((copy / "space.json").read_text().replace("cifar_resnet56", "cifar_resnet20"))
    with pytest.raises(ArtifactError, match="space.json"):
        load_supernet(copy)


def test_shipped_supernet_evaluates_on_embedded_images() -> None:
    loaded = load_supernet(SHIPPED)
    data = load_dataset("cifar10", None)
    loader = eval_loader(data.test_x[:500], data.test_y[:500], info=data.info, batch_size=250,
                         device=torch.device("cpu"), channels_last=False)
    largest = loaded.materialize(loaded.space.largest())
    acc_largest = evaluate_variant(largest, loader)[-1]
    assert acc_largest >= 0.8
    # The original keeps its statistics: calibrated and plain materialisation agree exactly.
    plain = loaded.net.materialize(loaded.space.largest())
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(largest(x), plain(x), atol=0, rtol=0)
    small = loaded.space.parse(loaded.space.make(
        ["w50" if p.kind == "width" else ("w50" if "w50" in p.choices else "base") for p in loaded.space.positions]
    ).arch_id)
    assert evaluate_variant(loaded.materialize(small), loader)[-1] >= 0.6
