"""Where the model to elastify comes from: a user file and factory, or a torchvision name.

Weights load through safetensors or ``torch.load(weights_only=True)`` (hmt.convert.sources);
the manifest records the source file's sha256, the factory and the weights' sha256.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hmt.convert.sources import import_torchvision
from hmt.errors import InputError, ModelError, UsageError

# The architectures the coverage tests and the benchmark use; any torchvision classifier
# name that takes ``num_classes`` works.
TORCHVISION_MODELS = (
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "shufflenet_v2_x1_0",
    "regnet_y_400mf",
    "vgg11_bn",
)


@dataclass(frozen=True)
class ModelSpec:
    """A model to elastify: exactly one of ``file``+``factory`` or ``torchvision``."""

    input_shape: tuple[int, ...]  # with the batch dimension, as --input-shape
    file: str | None = None
    factory: str | None = None
    torchvision: str | None = None
    num_classes: int | None = None  # torchvision only: the classifier width
    weights: str | None = None
    leaves: tuple[str, ...] = ()

    def validate(self) -> ModelSpec:
        if (self.file is None) == (self.torchvision is None):
            raise UsageError("give exactly one of --model FILE.py:FACTORY or --torchvision NAME")
        if len(self.input_shape) not in (3, 4) or any(d < 1 for d in self.input_shape):
            raise UsageError(
                f"--input-shape {','.join(map(str, self.input_shape))}: expected B,C,L (1-D) or B,C,H,W (images)"
            )
        return self

    def check_files(self) -> None:
        """InputError naming the option when the model file or the weights are not there
        (before the dataset is read and anything is hashed)."""
        for option, path in (("--model", self.file), ("--weights", self.weights)):
            if path is not None and not Path(path).is_file():
                shown = f"{path}:{self.factory}" if option == "--model" else path
                raise InputError(f"{option} {shown}: no such file")

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "input_shape": list(self.input_shape),
            "file": self.file,
            "factory": self.factory,
            "torchvision": self.torchvision,
            "num_classes": self.num_classes,
            "weights": self.weights,
            "leaves": list(self.leaves),
        }

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ModelSpec:
        try:
            return cls(
                input_shape=tuple(int(v) for v in data["input_shape"]),
                file=data.get("file"),
                factory=data.get("factory"),
                torchvision=data.get("torchvision"),
                num_classes=data.get("num_classes"),
                weights=data.get("weights"),
                leaves=tuple(str(v) for v in data.get("leaves", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"elastify model spec is malformed ({exc!r})") from exc


def parse_model_option(text: str) -> tuple[str, str]:
    """``path/to/file.py:factory`` -> (file, factory)."""
    file_text, sep, factory = text.rpartition(":")
    if not sep or not file_text.endswith(".py") or not factory.isidentifier():
        raise UsageError(f"--model {text!r}: expected path/to/file.py:factory_function")
    return file_text, factory


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_model(spec: ModelSpec, *, file_override: Path | None = None) -> nn.Module:
    """The user's network in eval mode, with ``spec.weights`` loaded (strict)."""
    from hmt.convert.sources import apply_weights, load_factory_module

    if spec.torchvision is not None:
        tv = import_torchvision()
        builder = getattr(tv.models, spec.torchvision, None)
        if builder is None or not callable(builder):
            raise UsageError(f"--torchvision {spec.torchvision!r}: torchvision.models has no such architecture")
        try:
            net = builder(weights=None, num_classes=spec.num_classes or 1000)
        except TypeError as exc:
            raise UsageError(f"--torchvision {spec.torchvision!r}: not a classifier builder ({exc})") from exc
    else:
        file = file_override or Path(str(spec.file))
        net = load_factory_module(f"{file}:{spec.factory}")
    if spec.weights is not None:
        apply_weights(net, Path(spec.weights))
    return net.eval()


def check_rebuilds_alone(spec: ModelSpec, model: nn.Module, *, copy_name: str) -> None:
    """Later stages rebuild the network from the artifact's copy of the model file alone
    (``copy_name``, nothing beside it) and load the artifact's weights into it: refuse now,
    before training, a factory that fails there (it reads a file beside it, say its
    weights) or builds another network there (names or shapes of the state dict differ)."""
    if spec.file is None:
        return
    from hmt.convert.sources import weights_mismatch

    shown = f"--model {spec.file}:{spec.factory}"
    way_out = ("later stages rebuild the network from the artifact's copy of the file alone: make the factory "
               "build the network without files beside it, and give its weights with --weights FILE")
    with tempfile.TemporaryDirectory(prefix="hmt-model-source-") as folder, torch.random.fork_rng():
        alone = Path(folder) / copy_name
        alone.write_bytes(Path(spec.file).read_bytes())
        try:
            rebuilt = build_model(replace(spec, weights=None), file_override=alone)
        except (ModelError, InputError) as exc:
            cause = exc.__cause__ or exc
            why = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
            raise ModelError(f"{shown}: the factory fails when its file is copied alone ({why}); {way_out}") from exc
    mismatch = weights_mismatch(model.state_dict(), rebuilt.state_dict())
    if mismatch:
        raise ModelError(f"{shown}: the factory builds another network when its file is copied alone "
                         f"({mismatch}); {way_out}")
