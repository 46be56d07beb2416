"""convert --supernet: variants materialised from a supernet become segment + exit chains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hmt.convert import SupernetSource, convert_model
from hmt.errors import UsageError

TINY = {
    "backbone": "cifar_resnet8", "batch_size": 32, "max_train_samples": 64, "backbone_epochs": 1,
    "partition_epochs": 0, "distill_epochs": 1, "finetune_epochs": 0, "eval_variants": 1,
    "val_fraction": 0.05, "calibration_samples": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def supernet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (tiny, barely trained) supernet artifact."""
    from hmt.supernet.train import resolve_config, train_supernet

    out = tmp_path_factory.mktemp("supernet") / "sn"
    train_supernet(resolve_config(overrides=TINY), out)
    return out


def test_largest_and_smallest_variants(supernet_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    result = convert_model(SupernetSource(supernet_dir, ("largest", "smallest"), batch=2), out)
    assert len(result.variants) == 2
    report = json.loads((out / "report.json").read_text())
    for variant in report["variants"]:
        chain = variant["chain"]
        assert chain["segments"][0]["input"]["shape"] == [2, 3, 32, 32]
        assert len(chain["segments"]) == len(chain["exits"]) >= 1
        assert all(v["passed"] for v in variant["verification"])
        assert variant["arch_id"] and (out / variant["folder"]).is_dir()
    largest, smallest = report["variants"]
    assert len(largest["chain"]["segments"]) >= len(smallest["chain"]["segments"])


def test_variant_id_without_space_tag(supernet_dir: Path, tmp_path: Path) -> None:
    """`hmt specialize --help` converts its variant as `--variant e3.555555555555`: the space tag
    left out, as specialize takes it; convert names the folder by the full id."""
    from hmt.supernet import load_supernet

    space = load_supernet(supernet_dir).space
    full = space.smallest().arch_id
    tagless = full.split(".", 1)[1]
    out = tmp_path / "converted"
    result = convert_model(SupernetSource(supernet_dir, (tagless,), batch=1), out)
    assert [v.arch_id for v in result.variants] == [full]
    assert (out / full).is_dir()


def test_supernet_needs_a_variant(supernet_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--variant"):
        convert_model(SupernetSource(supernet_dir, ()), tmp_path / "out")
    assert not (tmp_path / "out").exists()
