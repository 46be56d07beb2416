"""deploy --adaptable end to end on the shipped supernet: convert + fuse its smallest variant, a front that
names the supernet, deploy with the BN-adaptable graphs, verify (they answer as the fused chain), tamper."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hmt.artifacts import load_artifact

SHIPPED = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"


def test_deploy_adaptable_bundles_verified_bn_graphs(tmp_path: Path) -> None:
    import torch

    from hmt.convert import SupernetSource, convert_model
    from hmt.deploy import DeployOptions, deploy_bundle
    from hmt.deploy.verify import verify_bundle
    from hmt.errors import ArtifactError
    from hmt.fuse import FuseOptions, fuse_model
    from hmt.supernet import load_supernet
    from tests.deploy.conftest import make_pareto, point

    torch.set_num_threads(1)
    loaded = load_supernet(SHIPPED)
    arch = loaded.space.smallest().arch_id
    convert_model(SupernetSource(SHIPPED, (arch,)), tmp_path / "converted")
    fuse_model(tmp_path / "converted", tmp_path / "fused", options=FuseOptions(engines=("ort",), repeats=1, warmup=1))
    pareto = make_pareto(tmp_path / "pareto", [point(arch) | {"exit_stage": 0, "accuracy_per_exit": [0.4]}],
                         parents=[load_artifact(SHIPPED, kind="supernet").as_parent()])
    front = json.loads((pareto / "front.json").read_text())
    assert "supernet" not in front  # make_pareto writes none: --supernet names it
    out = tmp_path / "bundle"
    deploy_bundle(tmp_path / "fused", pareto, out, options=DeployOptions(
        target="x86-64", engines=("onnxruntime",), adaptable=True, supernet=SHIPPED))
    spec = json.loads((out / "bundle.json").read_text())
    record = spec["variants"][0]["extra"]["adaptable"]
    assert record["dir"] == f"variants/{arch}/adapt" and record["bn_layers"] > 0
    listed = {f["path"] for f in json.loads((out / "manifest.json").read_text())["files"]}
    assert f"{record['dir']}/bn.json" in listed and f"{record['dir']}/segment_0.stats.onnx" in listed
    checks = {c.name: c for c in verify_bundle(out).checks}
    assert checks[f"adaptable {arch}"].status == "ok", checks[f"adaptable {arch}"].detail
    changed = tmp_path / "changed"
    shutil.copytree(out, changed)
    (changed / record["dir"] / "bn.json").write_text("{}")
    with pytest.raises(ArtifactError, match="bn.json"):
        verify_bundle(changed)
