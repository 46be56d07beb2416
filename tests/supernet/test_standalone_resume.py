"""A standalone twin resumes from its per-epoch checkpoint to the same result as an
uninterrupted run (twins of long supernet runs outlast one lease's command)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hmt.data import load_dataset
from hmt.supernet.supernet import build_supernet
from hmt.supernet.train import standalone
from hmt.supernet.train.config import resolve_config


class _Killed(Exception):
    pass


def test_resumed_twin_equals_uninterrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = load_dataset("cifar10", None)
    config = dataclasses.replace(resolve_config(preset="tiny"), max_train_samples=256, batch_size=64,
                                 operators=("w50",))
    net = build_supernet(config.backbone, num_classes=10, input_shape=data.info.input_shape, operators=("w50",))
    arch = net.space.largest()
    cpu = torch.device("cpu")
    whole = standalone.train_standalone(arch, data, config, epochs=2, device=cpu, lr=0.05)

    real_save = standalone.save_checkpoint

    def save_then_die(directory: Path, state: dict) -> None:  # type: ignore[type-arg]
        real_save(directory, state)
        raise _Killed

    monkeypatch.setattr(standalone, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        standalone.train_standalone(arch, data, config, epochs=2, device=cpu, lr=0.05, checkpoint_dir=tmp_path)
    monkeypatch.setattr(standalone, "save_checkpoint", real_save)
    resumed = standalone.train_standalone(arch, data, config, epochs=2, device=cpu, lr=0.05, checkpoint_dir=tmp_path)
    assert resumed.test_acc == whole.test_acc
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["epoch"] == 2
