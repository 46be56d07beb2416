"""Block graphs of the shipped supernet, written once per session: two exit-0 variants (few units)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

SHIPPED = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"


def _exit0_ids() -> tuple[str, str]:
    """The shipped space's smallest exit-0 variant, and another exit-0 variant of depth and width
    (its block 1 runs where the smallest skips it)."""
    from hmt.supernet import load_supernet

    space = load_supernet(SHIPPED).space
    stage0 = ["w75", "w75", "base", "skip", "skip", "w75", "w75", "base", "w75"]
    other = space.make(stage0 + ["base"] * (len(space.positions) - len(stage0)), 0)
    return space.smallest(0).arch_id, other.arch_id


SMALLEST, OTHER = _exit0_ids()


@pytest.fixture(scope="session")
def written_blocks(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(artifact-as-bundle, write_blocks' summary, the loaded supernet, arch ids): blocks of SMALLEST and OTHER
    with a 48-sample labelled calibration set (random labels: the accuracy plumbing, not the number)."""
    import torch

    from hmt.artifacts import ArtifactWriter, load_artifact
    from hmt.deploy.blocks import BlocksOptions, write_blocks
    from hmt.supernet import load_supernet

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("blocks")
    rng = np.random.default_rng(0)
    data = root / "labelled.npz"
    np.savez(data, x=rng.standard_normal((64, 3, 32, 32)).astype(np.float32), y=rng.integers(0, 10, 64))
    loaded = load_supernet(SHIPPED)
    ids = [SMALLEST, OTHER]
    with ArtifactWriter(root / "art", kind="blocks-test", config={}) as writer:
        summary = write_blocks(writer, loaded, ids, BlocksOptions(extra_variants=1, bn_samples=64, data=data,
                                                                 max_samples=48))
    artifact = load_artifact(root / "art", kind="blocks-test")
    return SimpleNamespace(bundle=SimpleNamespace(artifact=artifact, root=artifact.root), summary=summary,
                           loaded=loaded, ids=ids, root=root)


def build_blocks_bundle(root: Path, arch_ids: list[str], *, data: Path, latency_ms: float | None = None) -> Path:
    """convert + fuse ``arch_ids`` of the shipped supernet, a front naming the supernet, deploy --blocks."""
    from hmt.artifacts import load_artifact
    from hmt.convert import SupernetSource, convert_model
    from hmt.deploy import DeployOptions, deploy_bundle
    from hmt.fuse import FuseOptions, fuse_model
    from tests.deploy.conftest import make_pareto, point

    convert_model(SupernetSource(SHIPPED, tuple(arch_ids)), root / "converted")
    fuse_model(root / "converted", root / "fused", options=FuseOptions(engines=("ort",), repeats=1, warmup=1))
    points = [point(a, accuracy=0.5 + 0.1 * i, latency_ms=1.0 + i) | {"exit_stage": 0, "accuracy_per_exit": [0.5]}
              for i, a in enumerate(arch_ids)]
    pareto = make_pareto(root / "pareto", points, parents=[load_artifact(SHIPPED, kind="supernet").as_parent()])
    out = root / "bundle"
    deploy_bundle(root / "fused", pareto, out, options=DeployOptions(
        target="x86-64", engines=("onnxruntime",), blocks=True, blocks_data=data, supernet=SHIPPED,
        latency_ms=latency_ms))
    return out
