"""No artifact holds an absolute path of the machine that wrote it (issue: artifacts travel).

The tiny pipeline, every path given absolute (the data too): supernet -> profile -> pareto -> convert ->
fuse -> deploy (+ offload halves); then every manifest and JSON file written is scanned.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.pareto.conftest import NANO


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _is_machine_path(text: str, machine: tuple[str, ...]) -> bool:
    """An absolute path of this machine (its first folder exists here: ONNX tensor names such as
    "/features/Conv_output_0" do not count). Inputs are recorded relative to the artifact (data by
    name and sha256 too), which is what keeps the lineage when artifacts move together."""
    if text.startswith(machine) or text.startswith("~"):
        return True
    first = text.split("/")[1] if text.startswith("/") else ""
    return bool(first) and Path("/", first).exists()


def _absolute_paths(root: Path, machine: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.json")):
        for text in _strings(json.loads(path.read_text())):
            if _is_machine_path(text, machine):
                found.append(f"{path.relative_to(root)}: {text[:120]}")
    return found


@pytest.mark.slow
def test_pipeline_artifacts_hold_no_absolute_path(tmp_path: Path) -> None:
    from commands.app import _register, app

    _register()
    runner = CliRunner()
    runs = tmp_path / "runs"

    def hmt(*args: str) -> None:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, result.output

    embedded = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded"  # given as a path, absolute
    tiny_supernet = runs / "supernet"
    hmt("train-supernet", "--backbone", "cifar_resnet8", "--data", str(embedded), "--max-train-samples", "32",
        "--batch-size", "32", "--backbone-epochs", "1", "--partition-epochs", "0", "--distill-epochs", "0",
        "--finetune-epochs", "0", "--eval-variants", "0", "--device", "cpu", "--out", str(tiny_supernet))
    hmt("profile-device", "--device", "jetson-nano", "--out", str(runs / "profile"))
    hmt("pareto", "--supernet", str(tiny_supernet), "--profile", str(runs / "profile"), "--evaluations", "2",
        "--population", "2", "--max-eval-samples", "8", "--threads", "1", "--out", str(runs / "pareto"))
    hmt("convert", "--supernet", str(tiny_supernet), "--pareto", str(runs / "pareto"), "--max-variants", "1",
        "--out", str(runs / "converted"))
    hmt("fuse", str(runs / "converted"), "--engine", "ort", "--repeats", "6", "--burst", "3", "--drop", "1",
        "--warmup", "1", "--no-ort-parallel", "--out", str(runs / "fused"))
    hmt("deploy", "--fused", str(runs / "fused"), "--pareto", str(runs / "pareto"), "--target", "x86-64",
        "--engine", "onnxruntime", "--profile", str(NANO), "--no-verify", "--out", str(runs / "bundle"))
    machine = (str(tmp_path), str(Path.cwd()), str(Path.home()))
    found = _absolute_paths(runs, machine)
    assert found == [], "\n".join(found)
    bundle = json.loads((runs / "bundle" / "bundle.json").read_text())
    assert bundle["preprocess"] is not None and bundle["class_names"]  # carried by the front, no lookup
