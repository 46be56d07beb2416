"""The supernet artifact: write after training, load (verified) for later stages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hmt.artifacts import Artifact, load_artifact
from hmt.errors import ArtifactError
from hmt.supernet.space import SearchSpace

KIND = "supernet"
WEIGHTS = "weights.safetensors"
SPACE = "space.json"
MODEL = "supernet.json"
VARIANTS = "variants.csv"
HISTORY = "history.json"
CURVES = "curves.png"


@dataclass
class LoadedSupernet:
    net: Any  # Supernet (typed loosely so this module imports without torch)
    space: SearchSpace
    artifact: Artifact
    model_info: dict[str, Any]

    @property
    def dataset_info(self) -> dict[str, Any]:
        return dict(self.model_info["dataset"])


def load_supernet(path: Path | str, *, device: str = "cpu") -> LoadedSupernet:
    """Load a supernet artifact: verify every checksum, rebuild the network, load weights."""
    from safetensors.torch import load_file

    from hmt.supernet.supernet import build_supernet

    artifact = load_artifact(path, kind=KIND)
    model_info = artifact.read_json(MODEL)
    space = SearchSpace.from_json_dict(artifact.read_json(SPACE))
    try:
        net = build_supernet(
            model_info["backbone"],
            num_classes=int(model_info["num_classes"]),
            input_shape=tuple(model_info["input_shape"]),
            operators=model_info.get("operators"),
        )
    except KeyError as exc:
        raise ArtifactError(f"{artifact.file(MODEL)}: missing field {exc}") from exc
    if net.space.tag != space.tag:
        raise ArtifactError(
            f"{artifact.file(SPACE)}: space {space.tag} does not match the rebuilt network's {net.space.tag}"
        )
    state = load_file(str(artifact.file(WEIGHTS)), device=device)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ArtifactError(
            f"{artifact.file(WEIGHTS)}: weights do not fit the network "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    net.to(device).eval()
    return LoadedSupernet(net=net, space=space, artifact=artifact, model_info=model_info)


def write_model_info(
    backbone: str, num_classes: int, input_shape: tuple[int, ...], operators: Any, dataset: dict[str, Any]
) -> str:
    return json.dumps(
        {
            "backbone": backbone,
            "num_classes": num_classes,
            "input_shape": list(input_shape),
            "operators": list(operators) if operators is not None else None,
            "dataset": dataset,
        },
        indent=2,
        sort_keys=True,
    )
