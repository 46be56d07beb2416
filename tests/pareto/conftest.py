"""A tiny trained supernet (CIFAR ResNet-8, one epoch on 32 images) and profiles for it.

Session-scoped: built once for every pareto test. Torch runs one intra-op thread here:
on a shared 2-core machine two spinning OpenMP threads made a ResNet-8 forward ~50x
slower than one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = {
    "backbone": "cifar_resnet8",
    "batch_size": 32,
    "max_train_samples": 32,
    "backbone_epochs": 1,
    "partition_epochs": 0,
    "distill_epochs": 0,
    "finetune_epochs": 0,
    "eval_variants": 0,
    "eval_batch_size": 256,
    "val_fraction": 0.05,
    "device": "cpu",
}
NANO = Path(__file__).resolve().parents[2] / "profiles" / "jetson-nano.json"


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():  # type: ignore[no-untyped-def]
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_supernet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hmt.supernet.train import resolve_config, train_supernet

    out = tmp_path_factory.mktemp("pareto") / "supernet"
    train_supernet(resolve_config(overrides=TINY), out)
    return out


@pytest.fixture(scope="session")
def tiny_loaded(tiny_supernet: Path):  # type: ignore[no-untyped-def]
    from hmt.supernet import load_supernet

    return load_supernet(tiny_supernet)


@pytest.fixture(scope="session")
def tiny_blocks(tiny_loaded):  # type: ignore[no-untyped-def]
    from hmt.pareto.objectives import measure_block_costs

    return measure_block_costs(tiny_loaded.net)


def block_table_profile(path: Path, shapes: dict[tuple[str, str], tuple[int, ...]], *,
                        space_tag: str | None = None, net_ms: float = 0.1,
                        overrides: dict[tuple[str, str], float] | None = None) -> Path:
    """The shipped Jetson Nano profile plus a made-up block latency table for ``shapes``."""
    import pandas as pd

    from hmt.profile.schema import profile_to_json_files, read_profile_json

    profile = read_profile_json(NANO)
    overrides = overrides or {}
    rows = [{"position": p, "choice": c, "batch": 1, "input_shape": "x".join(map(str, s)),
             "net_ms": overrides.get((p, c), net_ms * (1 + i % 5)), "overhead_ms": 0.05}
            for i, ((p, c), s) in enumerate(sorted(shapes.items()))]
    profile.add_table("block_latency", pd.DataFrame(rows),
                      units={"position": "name", "choice": "name", "batch": "count", "input_shape": "shape",
                             "net_ms": "ms", "overhead_ms": "ms"}, source="core")
    if space_tag is not None:
        profile.doc["supernet"] = {"path": "somewhere", "space_tag": space_tag}
    path.write_bytes(profile_to_json_files(profile, inline=True)["profile.json"])
    json.loads(path.read_text())
    return path
