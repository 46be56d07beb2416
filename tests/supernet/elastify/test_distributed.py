"""Elastification under torchrun: two processes (gloo on the CPU), gradients averaged, rank 0
writes the artifact and the original stays exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODELS = Path(__file__).resolve().parent / "models.py"


@pytest.mark.slow
def test_two_processes_elastify_one_artifact(tmp_path: Path) -> None:
    out = tmp_path / "sn"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "commands", "train-supernet", "--model", f"{MODELS}:user_net", "--input-shape", "1,3,32,32",
               "--device", "cpu", "--batch-size", "16", "--max-train-samples", "64", "--partition-epochs", "1",
               "--distill-epochs", "1", "--finetune-epochs", "2", "--eval-variants", "1",
               "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--json"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout)["metrics"]  # one document: rank 0 reports, rank 1 says nothing
    assert metrics["largest_vs_original_max_abs_after"] == 0.0
    history = json.loads((out / "history.json").read_text())
    assert [h["epoch"] for h in history if h["phase"] == "finetune"] == [0, 1]
    assert (out / "manifest.json").is_file() and not (tmp_path / "sn.ckpt").exists()
