"""The user's weights are the original: what a factory returns (or --weights) is kept
exactly; training the original first happens only on request (--train-original)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import commands.train_supernet  # noqa: F401 - registers the command
from commands.app import app
from hmt.errors import InputError, ModelError, UsageError
from hmt.supernet import load_supernet
from hmt.supernet.elastify.train import elastify_supernet
from hmt.supernet.train import resolve_config

MODELS = Path(__file__).resolve().parent / "models.py"


def _factory_model() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("elastify_models_original", MODELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.trained_user_net()


def _config(epochs: int, **extra: object) -> object:
    return resolve_config(overrides={
        "batch_size": 32, "max_train_samples": 32, "backbone_epochs": 2, "partition_epochs": epochs,
        "distill_epochs": epochs, "finetune_epochs": epochs, "eval_variants": 0, "finetune_random_subnets": 1,
        "calibration_samples": 32, "val_fraction": 0.05, "device": "cpu",
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "trained_user_net"},
                  **extra},
    })


def _largest_vs_factory(out: Path) -> float:
    loaded = load_supernet(out)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return float((loaded.net(x, loaded.space.largest()) - _factory_model()(x)).abs().max())


@pytest.mark.parametrize("epochs", [0, pytest.param(1, marks=pytest.mark.slow)],
                         ids=["untrained-variants", "trained-variants"])
def test_factory_weights_survive_elastification(tmp_path: Path, epochs: int) -> None:
    # backbone_epochs is 2, yet without --train-original the factory's model is the original
    result = elastify_supernet(_config(epochs), tmp_path / "sn", cache_dir=tmp_path / "cache")
    assert result.metrics["original_trained_here"] is False
    assert "as given" in result.metrics["original_weights"]
    assert _largest_vs_factory(tmp_path / "sn") <= 1e-5
    manifest = json.loads((tmp_path / "sn" / "manifest.json").read_text())
    assert manifest["config"]["extra"]["provenance"]["original_trained_here"] is False


@pytest.mark.slow
def test_train_original_trains_it_and_says_so(tmp_path: Path) -> None:
    result = elastify_supernet(_config(0, train_original=True), tmp_path / "sn", cache_dir=tmp_path / "cache")
    assert result.metrics["original_trained_here"] is True
    assert "trained here for 2 epoch(s)" in result.metrics["original_weights"]
    assert _largest_vs_factory(tmp_path / "sn") > 1e-3  # trained: no longer the factory's weights


def test_torchvision_without_weights_asks_for_train_original(tmp_path: Path) -> None:
    config = resolve_config(overrides={"extra": {"elastify": {"input_shape": [1, 3, 32, 32],
                                                              "torchvision": "resnet18"}}})
    with pytest.raises(UsageError, match="--train-original"):
        elastify_supernet(config, tmp_path / "sn")
    result = CliRunner().invoke(app, ["train-supernet", "--torchvision", "resnet18", "--input-shape", "1,3,32,32",
                                      "--out", str(tmp_path / "sn")])
    assert result.exit_code == 2
    assert "--train-original" in result.output and "--weights" in result.output
    assert not (tmp_path / "sn").exists()


def test_train_original_needs_epochs_and_a_model(tmp_path: Path) -> None:
    config = resolve_config(overrides={"backbone_epochs": 0, "extra": {
        "elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "user_net"},
        "train_original": True}})
    with pytest.raises(UsageError, match="--backbone-epochs"):
        elastify_supernet(config, tmp_path / "sn")
    result = CliRunner().invoke(app, ["train-supernet", "--train-original", "--out", str(tmp_path / "sn")])
    assert result.exit_code == 2 and "--model or --torchvision" in result.output


@pytest.mark.parametrize("option", ["--model", "--weights"])
def test_a_missing_model_file_or_weights_is_named_in_one_line(tmp_path: Path, option: str) -> None:
    model = f"{tmp_path / 'absent.py'}:build" if option == "--model" else f"{MODELS}:user_net"
    weights = ["--weights", str(tmp_path / "absent.safetensors")] if option == "--weights" else []
    result = CliRunner().invoke(app, ["train-supernet", "--model", model, *weights, "--input-shape", "1,3,32,32",
                                      "--out", str(tmp_path / "sn")])
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} ") and "absent" in lines[0]
    assert "no such file" in lines[0] and "internal error" not in result.output
    # The library refuses it too, before reading the dataset or hashing anything.
    config = resolve_config(overrides={"extra": {"elastify": {
        "input_shape": [1, 3, 32, 32], "file": model.rpartition(":")[0], "factory": model.rpartition(":")[2],
        "weights": weights[1] if weights else None}}})
    with pytest.raises(InputError, match=f"^{option} .*no such file"):
        elastify_supernet(config, tmp_path / "sn")


def test_train_original_refuses_a_training_forward_with_auxiliary_outputs(tmp_path: Path) -> None:
    config = resolve_config(overrides={
        "batch_size": 16, "max_train_samples": 32, "backbone_epochs": 1, "device": "cpu",
        "extra": {"elastify": {"input_shape": [1, 3, 32, 32], "file": str(MODELS), "factory": "aux_output_net"},
                  "train_original": True}})
    with pytest.raises(ModelError, match="^--train-original: in training mode the model returns tuple") as caught:
        elastify_supernet(config, tmp_path / "sn", cache_dir=tmp_path / "cache")
    assert "--weights" in str(caught.value) and "\n" not in str(caught.value)
