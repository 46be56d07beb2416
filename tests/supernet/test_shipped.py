"""The supernet shipped with the project: verified load, at most 10 MB, the original exact, a
specialized variant at least 2x cheaper within a point of it, no path of any machine inside, and
accuracy on the embedded test images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from hmt.data import eval_loader, load_dataset
from hmt.errors import ArtifactError
from hmt.supernet import load_supernet
from hmt.supernet.train.evaluate import evaluate_variant

SHIPPED = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"


def test_shipped_supernet_is_small_and_verified(tmp_path: Path) -> None:
    size_bytes = sum(f.stat().st_size for f in SHIPPED.iterdir())
    assert size_bytes <= 10_000_000
    loaded = load_supernet(SHIPPED)
    assert loaded.model_info["elastify"]["model"]["file"] == "cifar_resnet56.py"
    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED, copy)
    (copy / "space.json").write_text((copy / "space.json").read_text().replace('"w75"', '"w50"'))
    with pytest.raises(ArtifactError, match="space.json"):
        load_supernet(copy)


def test_its_variants_csv_lists_a_variant_2x_cheaper_within_a_point() -> None:
    """The front the demo converts: the largest (the original) and the specialized variants. The
    pretrained weights saw the validation images, so the margin is read on the test split."""
    table = pd.read_csv(SHIPPED / "variants.csv")
    largest = table[table.role == "largest"].iloc[0]
    specialized = table[table.role == "specialized"]
    assert not specialized.empty
    good = specialized[(specialized.macs * 2 <= largest.macs) & (specialized.test_acc >= largest.test_acc - 0.01)]
    assert not good.empty, specialized[["arch_id", "test_acc", "macs"]]


def test_no_path_of_any_machine_inside() -> None:
    def strings(value: object) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    for path in sorted(SHIPPED.glob("*.json")):
        found = [s for s in strings(json.loads(path.read_text())) if s.startswith(("/", "~")) or "../" in s]
        assert not found, (path.name, found)
    config = json.loads((SHIPPED / "manifest.json").read_text())["config"]
    assert config["data_path"] is None and json.loads((SHIPPED / "supernet.json").read_text())["dataset"][
        "source_sha256"]  # the data source: by name and sha256


def test_shipped_supernet_evaluates_on_embedded_images() -> None:
    loaded = load_supernet(SHIPPED)
    data = load_dataset("cifar10", None)
    loader = eval_loader(data.test_x[:500], data.test_y[:500], info=data.info, batch_size=250,
                         device=torch.device("cpu"), channels_last=False)
    largest = loaded.materialize(loaded.space.largest())
    assert evaluate_variant(largest, loader)[-1] >= 0.8
    # The original keeps its statistics: calibrated and plain materialisation agree exactly.
    plain = loaded.net.materialize(loaded.space.largest())
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(largest(x), plain(x), atol=0, rtol=0)
    table = pd.read_csv(SHIPPED / "variants.csv")
    for arch_id in table[table.role == "specialized"].arch_id:
        assert evaluate_variant(loaded.materialize(loaded.space.parse(arch_id)), loader)[-1] >= 0.8
