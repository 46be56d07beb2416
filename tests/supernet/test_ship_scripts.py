"""scripts/slim_supernet.py and scripts/ship_supernet.py, how the shipped supernet was made: the
alternatives no listed variant runs are dropped with every listed variant answering exactly as
before, and the shipped copy names no path of any machine and respects its size limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from hmt.supernet import load_supernet
from hmt.supernet.elastify.selection import SpecializeRequest
from hmt.supernet.elastify.specialize import specialize_supernet
from hmt.supernet.elastify.train import elastify_supernet
from hmt.supernet.train import resolve_config

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "supernet" / "elastify" / "models.py"
TINY = {"batch_size": 32, "max_train_samples": 32}


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def specialized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ship")
    config = resolve_config(overrides={
        **TINY, "backbone_epochs": 0, "partition_epochs": 1, "distill_epochs": 1, "finetune_epochs": 1,
        "eval_variants": 2, "finetune_random_subnets": 1, "calibration_samples": 32, "val_fraction": 0.05,
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "user_net"}},
    })
    elastify_supernet(config, root / "parent")
    specialize_supernet(root / "parent", root / "specialized",
                        SpecializeRequest(variants=("e2.555555",), epochs=1, **TINY))  # type: ignore[arg-type]
    return root / "specialized"


@pytest.mark.slow
def test_slimmed_and_shipped_variants_answer_as_before(specialized: Path, tmp_path: Path) -> None:
    before = load_supernet(specialized)
    assert "w75" in before.space.positions[0].choices
    done = script("slim_supernet.py", str(specialized), str(tmp_path / "slim"), "--operators", "w50",
                  "--calibration-samples", "16", "--data", str(REPO / "hmt" / "data" / "embedded"))
    assert done.returncode == 0, done.stderr[-2000:]
    done = script("ship_supernet.py", str(tmp_path / "slim"), str(tmp_path / "shipped"))
    assert done.returncode == 0, done.stderr[-2000:]
    after = load_supernet(tmp_path / "shipped")  # verified
    assert all(set(p.choices) <= {"base", "w50", "skip"} for p in after.space.positions)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    for old_id, new_id in zip(pd.read_csv(specialized / "variants.csv").arch_id,
                              pd.read_csv(tmp_path / "shipped" / "variants.csv").arch_id, strict=True):
        old, new = before.space.parse(old_id), after.space.parse(new_id)
        assert old.choices == new.choices
        with torch.no_grad():
            assert torch.equal(before.net.eval()(x, old), after.net.eval()(x, new))
    import numpy as np

    with np.load(tmp_path / "shipped" / "calibration.npz") as z:
        assert len(z["x"]) == 16
    text = "".join(p.read_text() for p in (tmp_path / "shipped").glob("*.json"))
    assert str(tmp_path) not in text and str(REPO) not in text and "../" not in text
    assert json.loads((tmp_path / "shipped" / "manifest.json").read_text())["config"]["data_path"] is None
    done = script("ship_supernet.py", str(tmp_path / "slim"), str(tmp_path / "small"), "--max-mb", "0.01")
    assert done.returncode == 1 and "over the 0.01 MB limit" in done.stderr and not (tmp_path / "small").exists()
