"""hmt convert / hmt fuse through the command line: output, exit codes, help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import commands.convert
import commands.fuse  # noqa: F401 - registers the command
from commands.app import app

runner = CliRunner()


def test_help_teaches_with_examples() -> None:
    for command in ("convert", "fuse"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
        assert f"hmt {command}" in result.output and "Examples" in result.output


def test_convert_then_fuse_json(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "conv"
    result = runner.invoke(app, ["convert", "--model", f"{model_file}:tiny", "--input-shape", "1,3,8,8",
                                 "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["report"]["variants"][0]["max_abs_error"] < 1e-4
    fused = tmp_path / "fused"
    result = runner.invoke(app, ["fuse", str(out), "--out", str(fused), "--engine", "ort", "--repeats", "3",
                                 "--pass", "reduction", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["metrics"]["model"]["latency_ms"] > 0


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--model", "x.py:f"], 2, "--input-shape"),
        (["--model", "{file}:broken", "--input-shape", "1,3,8,8"], 5, "factory exploded"),
        (["--model", "{file}:tiny", "--input-shape", "1,x,8"], 2, "comma-separated"),
        (["--onnx", "{dir}/missing.onnx"], 3, "missing.onnx: does not exist; expected an ONNX file"),
        (["--model", "{file}:tiny", "--onnx", "a.onnx", "--input-shape", "1,3,8,8"], 2, "exactly one"),
        # refused before any export (a NaN tolerance or opset 0 failed per variant after every exporter)
        (["--model", "{file}:tiny", "--input-shape", "1,3,8,8", "--atol", "nan"], 2, "--atol must be a finite"),
        (["--model", "{file}:tiny", "--input-shape", "1,3,8,8", "--rtol", "-1"], 2, "--rtol must be a finite"),
        (["--model", "{file}:tiny", "--input-shape", "1,3,8,8", "--opset", "0"], 2, "--opset must be in 7.."),
        (["--supernet", "{dir}/sn", "--variant", "largest", "--batch", "0"], 2, "--batch must be >= 1"),
    ],
)
def test_bad_input_exit_codes(model_file: Path, tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    args = [a.format(file=model_file, dir=tmp_path) for a in args]
    result = runner.invoke(app, ["convert", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == code, result.output
    assert needle in result.output
    assert not (tmp_path / "out").exists()
