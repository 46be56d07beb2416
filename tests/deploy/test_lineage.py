"""Preprocessing and class names reach the bundle wherever deploy runs from, or it refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.errors import InputError
from tests.deploy.conftest import make_pareto, point

NAMES = ["cat", "dog", "[red]bird", "fish"]


def _supernet(path: Path) -> Path:
    """A supernet artifact as far as deploy reads it: its dataset record."""
    dataset = {"name": "pets", "modality": "image", "input_shape": [3, 16, 16], "num_classes": 4,
               "class_names": NAMES, "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2], "source": "pets",
               "source_sha256": "1" * 64}
    with ArtifactWriter(path, kind="supernet", config={}) as writer:
        writer.write_json("supernet.json", {"dataset": dataset})
    return path


def _deploy(fused: Path, pareto: Path, out: Path, **extra: object) -> dict[str, object]:
    from hmt.deploy import DeployOptions, deploy_bundle

    deploy_bundle(fused, pareto, out, options=DeployOptions(target="x86-64", engines=("onnxruntime",), **extra))
    return dict(json.loads((out / "bundle.json").read_text()))


def test_deploy_from_another_directory_after_a_move(fused_dir: Path, variant_id: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A front written by an older pareto (no dataset record) names its supernet; the parent is
    recorded relative to the front, so moving both and running deploy elsewhere still finds it."""
    monkeypatch.chdir(tmp_path)
    supernet = load_artifact(_supernet(Path("a") / "supernet"), kind="supernet")
    make_pareto(Path("a") / "pareto", [point(variant_id)], parents=[supernet.as_parent()], dataset=None)
    shutil.move(tmp_path / "a", tmp_path / "b")
    shutil.copytree(fused_dir, tmp_path / "b" / "fused")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = _deploy(Path("../b/fused"), Path("../b/pareto"), Path("bundle"))
    assert spec["class_names"] == NAMES
    assert spec["preprocess"] == {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2], "layout": "NCHW",
                                  "pixel_scale": 255.0}


def test_bundle_without_preprocessing_needs_the_opt_out(fused_dir: Path, variant_id: str, tmp_path: Path) -> None:
    pareto = make_pareto(tmp_path / "pareto", [point(variant_id)], dataset=None)
    with pytest.raises(InputError, match="no preprocessing.*--no-preprocess"):
        _deploy(fused_dir, pareto, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()
    spec = _deploy(fused_dir, pareto, tmp_path / "bundle", allow_missing_preprocess=True)
    assert spec["preprocess"] is None
