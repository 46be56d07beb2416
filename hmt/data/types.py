"""The records every reader returns: a dataset's description and its arrays."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import PurePath
from typing import Any, NamedTuple

import numpy as np

from hmt.errors import InputError

DATASET_KINDS: tuple[str, ...] = ("cifar10", "mnist", "basicmotions", "fsdd")
MODALITIES: tuple[str, ...] = ("image", "sequence")


@dataclass(frozen=True)
class DatasetInfo:
    """What a model and a loader need to know about a dataset, without its arrays.

    ``input_shape`` excludes the batch: ``(C, H, W)`` for images, ``(C, L)`` for sequences.
    ``mean``/``std`` are per channel, in the units the loader divides by: pixel/255 for
    images, raw feature units for sequences. ``test_split`` says where the test split
    came from (predefined by the source, or drawn here with a recorded seed), so a
    reported accuracy can be traced to the exact held-out samples.
    """

    name: str
    modality: str
    input_shape: tuple[int, ...]
    num_classes: int
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str
    source_sha256: str
    test_split: str = "predefined by the source"

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise InputError(f"dataset {self.name!r}: modality {self.modality!r} is not one of {MODALITIES}")
        if len(self.class_names) != self.num_classes:
            raise InputError(
                f"dataset {self.name!r}: {len(self.class_names)} class names for {self.num_classes} classes"
            )
        channels = self.input_shape[0] if self.input_shape else 0
        if len(self.mean) != channels or len(self.std) != channels:
            raise InputError(
                f"dataset {self.name!r}: mean/std need one value per channel ({channels}), "
                f"got {len(self.mean)}/{len(self.std)}"
            )

    @property
    def num_channels(self) -> int:
        return self.input_shape[0]

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_artifact_dict(self) -> dict[str, Any]:
        """As an artifact records it: the source by its name (and ``source_sha256``), never a path
        of the machine that read it."""
        data = asdict(self)
        data["source"] = PurePath(self.source).name or self.source
        return data

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> DatasetInfo:
        try:
            return cls(
                name=str(data["name"]),
                modality=str(data["modality"]),
                input_shape=tuple(int(v) for v in data["input_shape"]),
                num_classes=int(data["num_classes"]),
                class_names=tuple(str(v) for v in data["class_names"]),
                mean=tuple(float(v) for v in data["mean"]),
                std=tuple(float(v) for v in data["std"]),
                source=str(data["source"]),
                source_sha256=str(data["source_sha256"]),
                test_split=str(data.get("test_split", "predefined by the source")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"malformed dataset info ({exc!r})") from exc


class Split(NamedTuple):
    """One labelled part of a dataset: ``x`` (N, ...) and ``y`` (N,) int64."""

    x: np.ndarray
    y: np.ndarray


# eq=False: a generated __eq__ would compare arrays elementwise and fail on truth value.
@dataclass(frozen=True, eq=False)
class Dataset:
    """Arrays of a dataset and their description.

    Images are uint8 ``(N, C, H, W)``; sequences float32 ``(N, C, L)``, not normalised
    (the loader normalises with ``info.mean``/``info.std``). Labels are int64 class indices.
    """

    info: DatasetInfo
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def __post_init__(self) -> None:
        for part, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            check_arrays(self.info, x, y, what=f"{self.info.name} {part} split")

    @property
    def train(self) -> Split:
        return Split(self.train_x, self.train_y)

    @property
    def test(self) -> Split:
        return Split(self.test_x, self.test_y)


def expected_dtype(info: DatasetInfo) -> np.dtype[Any]:
    return np.dtype(np.uint8) if info.modality == "image" else np.dtype(np.float32)


def check_arrays(info: DatasetInfo, x: np.ndarray, y: np.ndarray, *, what: str) -> None:
    """Refuse arrays that do not match ``info``: shape, dtype, label range."""
    if x.ndim != len(info.input_shape) + 1 or tuple(x.shape[1:]) != info.input_shape:
        raise InputError(f"{what}: x has shape {x.shape}; expected (N, {', '.join(map(str, info.input_shape))})")
    if x.dtype != expected_dtype(info):
        raise InputError(f"{what}: x has dtype {x.dtype}; expected {expected_dtype(info)} for {info.modality} data")
    if y.shape != (x.shape[0],) or y.dtype != np.int64:
        raise InputError(f"{what}: y has shape {y.shape} dtype {y.dtype}; expected ({x.shape[0]},) int64")
    if y.size and (int(y.min()) < 0 or int(y.max()) >= info.num_classes):
        raise InputError(f"{what}: labels span {int(y.min())}..{int(y.max())}; expected 0..{info.num_classes - 1}")
