"""A model file whose factory needs files beside it elastifies, but every later stage rebuilds
the network from the artifact's copy of the file alone: it is refused before training, in one
line saying why and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hmt.errors import ModelError
from hmt.supernet.elastify.source import ModelSpec, build_model, check_rebuilds_alone

NET = """
import json
from pathlib import Path

import torch
from torch import nn


def net(width=8):
    return nn.Sequential(nn.Conv1d(2, width, 3, padding=1), nn.ReLU(), nn.Conv1d(width, width, 3, padding=1),
                         nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(width, 3))


def self_contained():
    return net()


def weights_beside():
    model = net()
    model.load_state_dict(torch.load(Path(__file__).with_name("weights.pt"), weights_only=True))
    return model


def config_beside():
    config = Path(__file__).with_name("config.json")
    return net(json.loads(config.read_text())["width"] if config.exists() else 8)
"""


def _spec(tmp_path: Path, factory: str) -> tuple[ModelSpec, torch.nn.Module]:
    file = tmp_path / "net.py"
    file.write_text(NET)
    spec = ModelSpec(input_shape=(1, 2, 16), file=str(file), factory=factory)
    return spec, build_model(spec)


def test_self_contained_factory_passes(tmp_path: Path) -> None:
    spec, model = _spec(tmp_path, "self_contained")
    check_rebuilds_alone(spec, model, copy_name="source.py")


def test_factory_loading_weights_beside_its_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(NET)
    torch.save(build_model(ModelSpec(input_shape=(1, 2, 16), file=str(tmp_path / "net.py"),
                                     factory="self_contained")).state_dict(), tmp_path / "weights.pt")
    spec, model = _spec(tmp_path, "weights_beside")
    with pytest.raises(ModelError) as caught:
        check_rebuilds_alone(spec, model, copy_name="source.py")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--model {spec.file}:weights_beside: ")
    assert "FileNotFoundError" in message and "copied alone" in message and "--weights FILE" in message


def test_factory_reading_a_config_beside_its_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"width": 12}')
    spec, model = _spec(tmp_path, "config_beside")
    with pytest.raises(ModelError, match=r"builds another network when its file is copied alone \(shapes differ"):
        check_rebuilds_alone(spec, model, copy_name="source.py")
