"""Training as a real process: kill -9 at an arbitrary moment, rerun, it completes; on a GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
ARGS = [
    "train-supernet", "--backbone", "cifar_resnet8", "--max-train-samples", "256", "--batch-size", "32",
    "--backbone-epochs", "3", "--partition-epochs", "1", "--distill-epochs", "2", "--finetune-epochs", "2",
    "--eval-variants", "2",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_s", [4.0, 9.0, 15.0])
def test_kill_9_then_rerun_completes(tmp_path: Path, kill_after_s: float) -> None:
    out = tmp_path / "sn"
    command = [sys.executable, "-m", "commands", *ARGS, "--out", str(out), "--json"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(kill_after_s)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # Whatever moment it died at, there is no half-written artifact or checkpoint. A kill inside
    # the artifact's atomic write leaves its staging folder (nothing can clean up after SIGKILL);
    # the rerun's successful write removes it (hmt.artifacts.store).
    assert not out.exists() or (out / "manifest.json").is_file()
    rerun = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["metrics"]["variants_evaluated"] == 4
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.tmp"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_training_on_gpu(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "commands", *ARGS, "--device", "cuda", "--out", str(tmp_path / "sn"), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)["metrics"]
    assert metrics["device"] != "cpu"
