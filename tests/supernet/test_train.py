"""Training end to end on the embedded subset: artifact, resume, refusal of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hmt.errors import ArtifactError, UsageError
from hmt.supernet import load_supernet
from hmt.supernet.train import TrainingInterrupted, resolve_config, train_supernet

FAST = {
    "backbone": "cifar_resnet8",
    "batch_size": 32,
    "max_train_samples": 96,
    "backbone_epochs": 1,
    "partition_epochs": 1,
    "distill_epochs": 1,
    "finetune_epochs": 1,
    "eval_variants": 3,
    "finetune_random_subnets": 1,
    "eval_batch_size": 256,
    "val_fraction": 0.05,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "supernet"
    train_supernet(resolve_config(overrides=FAST), out)
    return out


def test_artifact_is_complete_and_consistent(trained: Path) -> None:
    loaded = load_supernet(trained)
    manifest = loaded.artifact.manifest
    assert {f.path for f in manifest.files} >= {
        "weights.safetensors",
        "space.json",
        "variants.csv",
        "curves.png",
        "history.json",
        "supernet.json",
        "calibration.npz",
    }
    assert manifest.config["backbone"] == "cifar_resnet8"
    assert 0.0 <= manifest.metrics["largest_test_acc"] <= 1.0
    import pandas as pd

    table = pd.read_csv(loaded.artifact.file("variants.csv"))
    assert set(table.role) >= {"largest", "smallest"} and len(table) == 5
    for column in ("val_acc_exit0", "test_acc", "params", "macs", "activation_peak_bytes", "memory_access_bytes"):
        assert column in table
    # Every id in the table parses and its materialised module equals the supernet path.
    x = torch.randn(2, *loaded.space.input_shape)
    for arch_id in table.arch_id:
        arch = loaded.space.parse(arch_id)
        with torch.no_grad():
            torch.testing.assert_close(loaded.net.materialize(arch)(x), loaded.net(x, arch), atol=1e-4, rtol=1e-4)
    assert not trained.with_name("supernet.ckpt").exists()  # checkpoint removed after success


def test_calibrated_materialisation_reestimates_bn(trained: Path) -> None:
    loaded = load_supernet(trained)
    arch = loaded.space.smallest()
    plain = loaded.materialize(arch, calibrate=False)
    calibrated = loaded.materialize(arch.arch_id)
    again = loaded.materialize(arch.arch_id)
    from hmt.supernet.calibrate import calibrated_norms

    norm = calibrated_norms(calibrated)[0]
    plain_norm = calibrated_norms(plain)[0]
    assert not torch.equal(norm.running_mean, plain_norm.running_mean)
    # The original network (the largest) keeps its trained statistics: every BN of it.
    largest = loaded.materialize(loaded.space.largest())
    plain_largest = loaded.materialize(loaded.space.largest(), calibrate=False)
    for a, b in zip(largest.modules(), plain_largest.modules(), strict=True):
        if isinstance(a, torch.nn.BatchNorm2d) and getattr(a, "hmt_keep_statistics", False):
            assert torch.equal(a.running_mean, b.running_mean)
    assert calibrated_norms(largest) != list(m for m in largest.modules() if isinstance(m, torch.nn.BatchNorm2d))
    x = torch.randn(3, *loaded.space.input_shape)
    with torch.no_grad():
        torch.testing.assert_close(calibrated(x), again(x))  # deterministic
    assert not calibrated.training


def test_tampered_weights_refused(trained: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    blob = bytearray((copy / "weights.safetensors").read_bytes())
    blob[-10] ^= 0xFF
    (copy / "weights.safetensors").write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match="weights.safetensors"):
        load_supernet(copy)


@pytest.mark.parametrize("mode", ["freeze", "update-if-better"])
def test_resume_after_interruption_equals_uninterrupted(tmp_path: Path, mode: str) -> None:
    config = resolve_config(overrides={**FAST, "partition_mode": mode, "eval_variants": 1})
    straight = train_supernet(config, tmp_path / "a")
    assert straight is not None
    # Stop right after the 2nd and then the 5th epoch's checkpoint, then finish.
    with pytest.raises(TrainingInterrupted):
        train_supernet(config, tmp_path / "b", stop_after_epochs=2)
    assert not (tmp_path / "b").exists()  # no artifact until the run completes
    with pytest.raises(TrainingInterrupted):
        train_supernet(config, tmp_path / "b", stop_after_epochs=3)
    train_supernet(config, tmp_path / "b")
    a = load_file(str(tmp_path / "a" / "weights.safetensors"))
    b = load_file(str(tmp_path / "b" / "weights.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resume_with_another_config_is_refused(tmp_path: Path) -> None:
    config = resolve_config(overrides=FAST)
    notes: list[str] = []
    with pytest.raises(TrainingInterrupted):
        train_supernet(config, tmp_path / "c", stop_after_epochs=1, notify=notes.append)
    assert notes == []  # a fresh start says nothing about resuming
    with pytest.raises(TrainingInterrupted):
        train_supernet(config, tmp_path / "c", stop_after_epochs=1, notify=notes.append)
    assert len(notes) == 1 and notes[0].startswith("resuming from epoch 2 (phase 1, its epoch 2)"), notes
    assert str(tmp_path / "c.ckpt" / "checkpoint.pt") in notes[0]
    other = resolve_config(overrides={**FAST, "seed": 1})
    with pytest.raises(UsageError, match="another training config"):
        train_supernet(other, tmp_path / "c")
    # --restart discards it.
    with pytest.raises(TrainingInterrupted):
        train_supernet(other, tmp_path / "c", restart=True, stop_after_epochs=1)


def test_bad_options_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown preset"):
        resolve_config(preset="huge")
    with pytest.raises(UsageError, match="partition_mode"):
        resolve_config(overrides={"partition_mode": "sometimes"})
    with pytest.raises(UsageError, match="batch_size"):
        resolve_config(overrides={"batch_size": 0})
    with pytest.raises(UsageError, match="unknown training option"):
        resolve_config(overrides={"bakbone": "x"})
    bad_file = tmp_path / "cfg.json"
    bad_file.write_text('{"backbone_epochs": "many"}')
    with pytest.raises(UsageError, match="backbone_epochs"):
        resolve_config(config_file=bad_file)
    with pytest.raises(UsageError, match="sequence inputs"):
        train_supernet(resolve_config(overrides={**FAST, "backbone": "conv1d"}), tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_config_file_that_cannot_be_parsed_or_read_is_one_input_error(tmp_path: Path) -> None:
    from hmt.errors import InputError

    deep = tmp_path / "deep.json"
    deep.write_bytes(b"[" * 100_000 + b"]" * 100_000)  # json.loads: RecursionError
    with pytest.raises(InputError, match="deep.json: not valid JSON"):
        resolve_config(preset="tiny", config_file=deep)
    with pytest.raises(InputError, match="cannot be read"):
        resolve_config(preset="tiny", config_file=tmp_path)  # a folder: IsADirectoryError
