"""The held-out data accuracy is measured on.

By default the supernet's own validation split, reproduced exactly from its manifest
(same dataset file, checked by sha256; same fraction and seed). Or the user's "edge"
data: a dataset path of the same kind, checked against the supernet's input shape and
classes. Optionally a seeded, stratified subset (AdaptiveNet searches on 500 images).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hmt.errors import ArtifactError, InputError, UsageError

if TYPE_CHECKING:
    import torch

    from hmt.data import DatasetInfo

DATA_SPLITS = ("test", "train", "all", "val")  # val: the supernet's own validation split


@dataclass(frozen=True)
class HeldOut:
    x: np.ndarray
    y: np.ndarray
    info: DatasetInfo  # the supernet's (its normalisation is applied)
    source: str  # what the samples are, for the manifest and the report

    def __len__(self) -> int:
        return len(self.y)

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "samples": len(self.y), "classes": len(np.unique(self.y))}


def held_out_data(loaded: Any, *, data_path: Path | None = None, split: str = "test",
                  max_samples: int | None = None, seed: int = 0, cache_dir: Path | None = None) -> HeldOut:
    """Held-out samples for a loaded supernet (``hmt.supernet.load_supernet``)."""
    from hmt.data import DatasetInfo, load_dataset, stratified_indices

    info = DatasetInfo.from_json_dict(loaded.dataset_info)
    config = loaded.artifact.manifest.config
    kind = str(config.get("dataset", info.name))
    if split not in DATA_SPLITS:
        raise UsageError(f"data split {split!r} is not one of {', '.join(DATA_SPLITS)}")
    if max_samples is not None and max_samples < 1:
        raise UsageError(f"max eval samples must be >= 1, got {max_samples}")
    if data_path is None or split == "val":
        x, y, source = _validation_split(loaded, kind, info, data_path, cache_dir)
    else:
        data = load_dataset(kind, data_path, cache_dir=cache_dir)
        mismatch = []
        if data.info.input_shape != info.input_shape:
            mismatch.append(f"input shape {data.info.input_shape} vs {info.input_shape}")
        if data.info.num_classes != info.num_classes:
            mismatch.append(f"{data.info.num_classes} classes vs {info.num_classes}")
        if data.info.modality != info.modality:
            mismatch.append(f"modality {data.info.modality} vs {info.modality}")
        if mismatch:
            raise InputError(f"{data_path}: does not match the supernet's data ({'; '.join(mismatch)})")
        parts = {"test": [data.test], "train": [data.train], "all": [data.train, data.test]}[split]
        x = np.concatenate([p.x for p in parts])
        y = np.concatenate([p.y for p in parts])
        source = f"{split} split of the {kind} data given (sha256 {data.info.source_sha256[:12]})"
    if len(y) == 0:
        raise InputError(f"no held-out samples in the {source}")
    if max_samples is not None and max_samples < len(y):
        _, keep = stratified_indices(y, max_samples / len(y), np.random.default_rng(seed))
        keep = keep[:max_samples]
        x, y = x[keep], y[keep]
        source += f", stratified subset of {len(y)} (seed {seed})"
    return HeldOut(x, y, info, source)


def _validation_split(loaded: Any, kind: str, info: DatasetInfo, data_path: Path | None,
                      cache_dir: Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """The supernet's validation split, rebuilt from its recorded data (or ``data_path``, which
    must be the same file by sha256) with the manifest's fraction and seed."""
    from hmt.artifacts.paths import resolve_recorded
    from hmt.data import load_dataset, split_train_val
    from hmt.supernet.train.trainer import derive_seed

    config = loaded.artifact.manifest.config
    recorded = config.get("data_path")
    where = data_path if data_path is not None else (
        resolve_recorded(recorded, loaded.artifact.root) if recorded else None)
    try:
        data = load_dataset(kind, where, cache_dir=cache_dir)
    except InputError as exc:
        raise InputError(f"cannot reload the supernet's training data to rebuild its validation split "
                         f"({exc}); pass --data with the data it was trained on") from exc
    if data.info.source_sha256 != info.source_sha256:
        named = data_path or recorded or "the embedded subset"
        raise ArtifactError(f"{loaded.artifact.root}: the supernet was trained on data with sha256 "
                            f"{info.source_sha256[:12]}, the data at {named} has "
                            f"{data.info.source_sha256[:12]}; its validation split cannot be rebuilt "
                            "(pass --data with the data it was trained on)")
    try:
        fraction, train_seed = float(config["val_fraction"]), int(config["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{loaded.artifact.root}: manifest config lacks val_fraction/seed ({exc})") from exc
    _, val = split_train_val(data, fraction, np.random.default_rng(derive_seed(train_seed, 1)))
    named = Path(str(where)).name if where is not None else "embedded subset"
    return val.x, val.y, f"validation split of the supernet's data ({named}, {fraction:g}, seed {train_seed})"


def device_batches(data: HeldOut, *, batch_size: int, device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The samples normalised, in order, as (inputs, labels) batches on ``device``."""
    import torch

    from hmt.data import BatchLoader

    if batch_size < 1:
        raise UsageError(f"batch size must be >= 1, got {batch_size}")
    loader = BatchLoader(data.x, data.y, info=data.info, batch_size=batch_size, device=device, augment=False,
                         shuffle=False, generator=torch.Generator().manual_seed(0))
    return list(loader)


def calibration_batches(loaded: Any, *, device: str = "cpu", max_samples: int | None = None
                        ) -> list[torch.Tensor] | None:
    """The supernet's stored BN-calibration inputs, batched as train-supernet batched them
    for its variant table (so accuracies match it exactly); ``None`` if it stores none.
    ``max_samples`` keeps only the first samples of that mixed order (``hmt.supernet.calibrate.mixed``:
    every class, not the first classes of a class-ordered dataset; faster, statistics a little noisier)."""
    from hmt.supernet.artifact import CALIBRATION

    if not any(record.path == CALIBRATION for record in loaded.artifact.manifest.files):
        return None
    if max_samples is not None and max_samples < 1:
        raise UsageError(f"calibration samples must be >= 1, got {max_samples}")
    batch_size = int(loaded.artifact.manifest.config.get("eval_batch_size", 256))
    batches: list[torch.Tensor] = loaded.calibration_batches(batch_size=batch_size, device=device)
    if max_samples is None:
        return batches
    kept: list[torch.Tensor] = []
    total = 0
    for xb in batches:
        if total >= max_samples:
            break
        kept.append(xb[: max_samples - total])
        total += len(kept[-1])
    return kept
