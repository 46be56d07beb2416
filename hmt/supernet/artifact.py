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
CALIBRATION = "calibration.npz"


def unshared(state: dict[str, Any]) -> dict[str, Any]:
    """``state``'s tensors, each one sharing storage with an earlier one (tied weights, a
    layer reused under two names) copied, as safetensors writes no shared memory; loading the
    file into the rebuilt network, which ties them again, gives the same values."""
    seen: set[int] = set()
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen and tensor.numel() else tensor
        seen.add(pointer)
    return out


def weights_for_file(net: Any) -> dict[str, Any]:
    """``net``'s state dict as :data:`WEIGHTS` stores it: detached, on the CPU, contiguous, unshared."""
    return unshared({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()})


@dataclass
class LoadedSupernet:
    net: Any  # Supernet (typed loosely so this module imports without torch)
    space: SearchSpace
    artifact: Artifact
    model_info: dict[str, Any]

    @property
    def dataset_info(self) -> dict[str, Any]:
        return dict(self.model_info["dataset"])

    def calibration_batches(self, *, batch_size: int = 256, device: str = "cpu") -> list[Any]:
        """The stored calibration samples, normalised as in training, as tensors on ``device``, in the
        fixed mixed order of :func:`hmt.supernet.calibrate.mixed` (not the stored order, which may hold
        one class per batch)."""
        import numpy as np
        import torch

        from hmt.data import DatasetInfo, batches_of, eval_loader
        from hmt.supernet.calibrate import mixed

        with np.load(self.artifact.file(CALIBRATION), allow_pickle=False) as blob:
            x = mixed(blob["x"])
        info = DatasetInfo.from_json_dict(self.dataset_info)
        return batches_of(
            eval_loader(x, None, info=info, batch_size=batch_size, device=torch.device(device), channels_last=False)
        )

    def materialize(self, arch: Any, *, calibrate: bool = True) -> Any:
        """A plain eval-mode module for ``arch`` (an ArchConfig or an arch id). With
        ``calibrate`` its BN statistics are re-estimated on the stored calibration set,
        which is what the variant table's accuracies were measured with."""
        from hmt.supernet.calibrate import recalibrate_bn

        if isinstance(arch, str):
            arch = self.space.parse(arch)
        variant = self.net.materialize(arch)
        if calibrate:
            device = next(self.net.parameters()).device
            recalibrate_bn(variant, self.calibration_batches(device=str(device)))
        return variant.eval()


def load_supernet(path: Path | str, *, device: str = "cpu") -> LoadedSupernet:
    """Load a supernet artifact: verify every checksum, rebuild the network, load weights."""
    from safetensors.torch import load_file

    from hmt.supernet.supernet import build_supernet

    artifact = load_artifact(path, kind=KIND)
    model_info = artifact.read_json(MODEL)
    space = SearchSpace.from_json_dict(artifact.read_json(SPACE))
    elastified = _elastified_net(artifact, model_info)
    try:
        net = elastified if elastified is not None else build_supernet(
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


def _elastified_net(artifact: Artifact, model_info: dict[str, Any]) -> Any:
    """A user model elastified by hmt.supernet.elastify (rebuilt from its stored source), else None."""
    if "elastify" not in model_info:
        return None
    from hmt.supernet.elastify.rebuild import rebuild

    source = model_info["elastify"].get("source")
    return rebuild(model_info, artifact.file(source) if source else None)


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
