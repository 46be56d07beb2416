"""Block graphs of the shipped supernet, written once per session: two exit-0 variants (few units)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

SHIPPED = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"
SMALLEST = "cifar_resnet56-03130f.e0.5SSSSSSSSSxxxxxxxxxxxxxxxxxxxx"
OTHER = "cifar_resnet56-03130f.e0.55BSS55B57xxxxxxxxxxxxxxxxxxxx"


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
