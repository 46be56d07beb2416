"""``hmt adapt`` end to end on the torch-free path: a BN-adaptable export and a shift set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hmt.adapt.bn_export import export_bn_adaptable
from hmt.adapt.corruptions import write_shift_set
from tests.adapt.conftest import TinyVariant

REPO = Path(__file__).resolve().parents[2]


def hmt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "commands", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)


def test_adapt_bn_adaptable_graphs_on_a_shift_set(tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor],
                                                  tmp_path: Path) -> None:
    model, _, _ = tiny_trained
    export_bn_adaptable(model, torch.zeros(2, 3, 12, 12), tmp_path / "bn")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(40, 3, 12, 12), dtype=np.uint8)
    write_shift_set(tmp_path / "shift", x, np.arange(40, dtype=np.int64) % 10, corruptions=["contrast"],
                    severities=[5], seed=0, source={})
    done = hmt("adapt", str(tmp_path / "bn"), "--method", "bn", "--data", str(tmp_path / "shift"),
               "--batch-size", "16", "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["name"] for r in report["sets"]] == ["clean", "contrast-s5"]
    for row in report["sets"]:
        assert 0 <= row["accuracy_before"] <= 1 and 0 <= row["accuracy_after"] <= 1
        assert row["adapt_ms_per_batch"] > 0 and isinstance(row["accepted"], bool)
    assert (tmp_path / "out" / "report.json").is_file() and (tmp_path / "out" / "manifest.json").is_file()


@pytest.mark.slow
def test_adapt_bad_input_exit_codes(tiny_trained: tuple[TinyVariant, torch.Tensor, torch.Tensor],
                                    tmp_path: Path) -> None:
    model, _, _ = tiny_trained
    export_bn_adaptable(model, torch.zeros(2, 3, 12, 12), tmp_path / "bn")
    x = np.zeros((8, 3, 12, 12), dtype=np.uint8)
    write_shift_set(tmp_path / "shift", x, np.arange(8, dtype=np.int64), corruptions=[], severities=[], seed=0,
                    source={})
    refused = hmt("adapt", str(tmp_path / "bn"), "--method", "tent", "--data", str(tmp_path / "shift"),
                  "--out", str(tmp_path / "out2"))
    assert refused.returncode == 2 and "--method bn" in refused.stderr and "Traceback" not in refused.stderr
    missing = hmt("adapt", str(tmp_path / "bn"), "--method", "bn", "--data", str(tmp_path / "nowhere"))
    assert missing.returncode == 3 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr
