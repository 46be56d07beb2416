"""A model whose layers share a parameter (weight tying) elastifies and writes its artifact.

safetensors refuses tensors that share memory, so the supernet's weights are written with the
tied ones stored once each name; the artifact loads back into the rebuilt network (where the
factory ties them again) and its largest variant is the model, exactly. It used to train
the whole supernet and then end in exit 70 ('Some tensors share memory') writing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from hmt.supernet import load_supernet
from hmt.supernet.artifact import unshared
from hmt.supernet.elastify.train import elastify_supernet
from hmt.supernet.train import resolve_config

MODELS = Path(__file__).resolve().parent / "models.py"


def _tied() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("elastify_models_tied", MODELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tied_resnet()


def test_unshared_copies_only_the_tensors_that_share_storage() -> None:
    weight = torch.randn(4, 4)
    state = {"a": weight, "b": weight, "c": torch.randn(3)}
    out = unshared(state)
    assert out["a"] is weight and out["c"] is state["c"]
    assert out["b"] is not weight and torch.equal(out["b"], weight)
    assert out["b"].untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()


def test_a_model_with_tied_weights_elastifies_and_reloads_exact(tmp_path: Path) -> None:
    config = resolve_config(overrides={
        "batch_size": 32, "max_train_samples": 32, "partition_epochs": 0, "distill_epochs": 0, "finetune_epochs": 0,
        "eval_variants": 0, "calibration_samples": 32, "val_fraction": 0.05, "device": "cpu",
        "operators": ["w50", "skip"],
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "tied_resnet"}},
    })
    result = elastify_supernet(config, tmp_path / "sn", cache_dir=tmp_path / "cache")
    assert result.metrics["largest_vs_original_max_abs_after"] <= 1e-5
    loaded = load_supernet(tmp_path / "sn")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((loaded.net(x, loaded.space.largest()) - _tied()(x)).abs().max()) <= 1e-5
