"""``hmt convert --pareto``: the points of a front become converted variants (lineage checked)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from commands.app import _register, app
from hmt.artifacts import load_artifact
from hmt.artifacts.manifest import content_digest
from hmt.pareto.artifact import front_variant_ids, load_front

from .conftest import NANO, TINY

_register()


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args))


def _front(tiny_supernet: Path, out: Path) -> Path:
    result = invoke("pareto", "--supernet", str(tiny_supernet), "--profile", str(NANO), "--out", str(out),
                    "--evaluations", "8", "--population", "4", "--max-eval-samples", "16", "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    return out


def test_front_spread_keeps_fastest_and_most_accurate(tiny_supernet: Path, tmp_path: Path) -> None:
    front = load_front(_front(tiny_supernet, tmp_path / "p"))
    points = sorted(front.points, key=lambda p: p["latency_ms"])
    every = front_variant_ids(front)
    assert every == [p["arch_id"] for p in points]
    fastest = points[0]["arch_id"]
    best = max(points, key=lambda p: p["accuracy"])["arch_id"]
    for n in range(1, len(points) + 2):
        chosen = front_variant_ids(front, max_variants=n)
        assert len(chosen) == min(n, len(points)) and len(set(chosen)) == len(chosen)
        assert best in chosen
        if n >= 2:
            assert fastest in chosen


def test_convert_front_records_lineage_and_refuses_another_supernet(tiny_supernet: Path, tmp_path: Path) -> None:
    pareto = _front(tiny_supernet, tmp_path / "p")
    out = tmp_path / "c"
    result = invoke("convert", "--supernet", str(tiny_supernet), "--pareto", str(pareto), "--max-variants", "2",
                    "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    converted = load_artifact(out, kind="converted")
    assert {p.kind for p in converted.manifest.parents} == {"supernet", "pareto"}
    names = [v["arch_id"] for v in json.loads((out / "report.json").read_text())["variants"]]
    assert names == front_variant_ids(load_front(pareto), max_variants=2)

    # Same weights under a different manifest (another training run): the front does not belong to it.
    other = tmp_path / "other"
    shutil.copytree(tiny_supernet, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["config"]["note"] = "another run"
    manifest["content_sha256"] = content_digest(manifest)
    (other / "manifest.json").write_text(json.dumps(manifest))
    refused = invoke("convert", "--supernet", str(other), "--pareto", str(pareto), "--out", str(tmp_path / "x"))
    assert refused.exit_code == 4 and "searched on another supernet" in refused.output
    assert not (tmp_path / "x").exists()
    assert invoke("convert", "--onnx", "m.onnx", "--pareto", str(pareto)).exit_code == 2
    assert TINY["backbone"] in names[0]


def test_accuracy_floor_leaves_out_points_below_it(tiny_supernet: Path, tmp_path: Path) -> None:
    pareto = _front(tiny_supernet, tmp_path / "p")
    front = load_front(pareto)
    accuracies = sorted({float(p["accuracy"]) for p in front.points})
    floor = accuracies[len(accuracies) // 2]
    kept = front_variant_ids(front, min_accuracy=floor)
    by_id = {p["arch_id"]: float(p["accuracy"]) for p in front.points}
    assert kept and all(by_id[a] >= floor for a in kept)
    assert len(kept) == sum(a >= floor for a in by_id.values())
    assert front_variant_ids(front, min_accuracy=floor, max_variants=1) == [max(by_id, key=by_id.__getitem__)]
    result = invoke("convert", "--supernet", str(tiny_supernet), "--pareto", str(pareto), "--min-accuracy",
                    f"{100 * accuracies[-1] + 1:.2f}", "--out", str(tmp_path / "c"))
    assert result.exit_code != 0 and "no front point reaches" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "c").exists()


def test_accuracy_floor_is_a_percentage(tiny_supernet: Path, tmp_path: Path) -> None:
    result = invoke("convert", "--supernet", str(tiny_supernet), "--pareto", str(tmp_path / "p"), "--min-accuracy",
                    "150", "--out", str(tmp_path / "c"))
    assert result.exit_code != 0 and "--min-accuracy is a percentage in [0, 100], got 150" in result.output
    assert not (tmp_path / "c").exists()
