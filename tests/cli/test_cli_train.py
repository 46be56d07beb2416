"""The command line as a user and a CI script meet it: help, --json, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def hmt(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commands.app", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_help_lists_every_stage() -> None:
    result = hmt("--help")
    assert result.returncode == 0
    for command in ("train-supernet", "profile-device", "pareto", "convert", "fuse"):
        assert command in result.stdout
    sub = hmt("train-supernet", "--help")
    assert sub.returncode == 0 and "hmt train-supernet --preset tiny" in sub.stdout


def test_json_output_is_one_document(tmp_path: Path) -> None:
    result = hmt(
        "train-supernet",
        "--backbone",
        "cifar_resnet8",
        "--max-train-samples",
        "64",
        "--batch-size",
        "32",
        "--backbone-epochs",
        "1",
        "--partition-epochs",
        "0",
        "--distill-epochs",
        "1",
        "--finetune-epochs",
        "1",
        "--eval-variants",
        "2",
        "--out",
        str(tmp_path / "sn"),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["out"] == str(tmp_path / "sn")
    assert 0.0 <= document["metrics"]["largest_test_acc"] <= 1.0


def test_unknown_backbone_exit_code_and_no_traceback(tmp_path: Path) -> None:
    result = hmt("train-supernet", "--backbone", "resnet9000", "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert "unknown backbone 'resnet9000'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()
    debug = hmt("train-supernet", "--backbone", "resnet9000", "--out", str(tmp_path / "x"), "--debug")
    assert "Traceback" in debug.stderr


def test_corrupt_dataset_names_the_file(tmp_path: Path) -> None:
    data = tmp_path / "cifar"
    data.mkdir()
    source = REPO / "hmt" / "data" / "embedded"
    (data / "train.zip").write_bytes((source / "train.zip").read_bytes()[:100_000])
    (data / "test.zip").write_bytes((source / "test.zip").read_bytes())
    result = hmt(
        "train-supernet", "--data", str(data), "--out", str(tmp_path / "x"), "--cache-dir", str(tmp_path / "cache")
    )
    assert result.returncode == 3, result.stderr
    assert "train.zip" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x").exists()
