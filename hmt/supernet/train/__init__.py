"""``train_supernet``: train (or resume) the supernet and write its artifact."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hmt.artifacts import ArtifactWriter
from hmt.data import BatchLoader
from hmt.errors import InputError
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.artifact import (
    CALIBRATION,
    CURVES,
    HISTORY,
    KIND,
    MODEL,
    SPACE,
    VARIANTS,
    WEIGHTS,
    weights_for_file,
    write_model_info,
)
from hmt.supernet.train.checkpoint import release_checkpoint_dir
from hmt.supernet.train.config import PRESETS, TrainConfig, portable_config, resolve_config
from hmt.supernet.train.trainer import TrainedSupernet, TrainingInterrupted, derive_seed, train_supernet_model

__all__ = ["PRESETS", "TrainConfig", "TrainResult", "TrainingInterrupted", "resolve_config", "train_supernet"]


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    metrics: dict[str, Any]
    variants: Any  # pandas DataFrame


def default_checkpoint_dir(out_dir: Path) -> Path:
    out_dir = Path(os.path.abspath(out_dir))  # "." has no name to derive the folder's from
    return out_dir.with_name(out_dir.name + ".ckpt")


def check_training_outputs(config: TrainConfig, out_dir: Path, checkpoint_dir: Path, *, force: bool = False,
                           inputs: tuple[str | Path | None, ...] = ()) -> None:
    """Refuse, before any training, an output or checkpoint folder that is not hmt's to replace."""
    from hmt.artifacts.outputs import check_output_dir
    from hmt.supernet.train.checkpoint import claim_checkpoint_dir

    given = tuple(p for p in (config.data_path, config.pretrained, *inputs) if p)
    check_output_dir(out_dir, kind=KIND, inputs=given, force=force)
    ckpt, out = Path(checkpoint_dir).resolve(), Path(out_dir).resolve()
    if ckpt == out or out in ckpt.parents or ckpt in out.parents:
        raise InputError(f"--checkpoint-dir {checkpoint_dir}: overlaps --out {out_dir}; the checkpoints need a "
                         f"folder of their own (the default is {Path(out_dir).name}.ckpt beside the output)")
    claim_checkpoint_dir(checkpoint_dir, inputs=(*given, out_dir))


def train_supernet(
    config: TrainConfig,
    out_dir: Path,
    *,
    checkpoint_dir: Path | None = None,
    restart: bool = False,
    keep_checkpoint: bool = False,
    cache_dir: Path | None = None,
    progress: ProgressCallback = no_progress,
    stop_after_epochs: int | None = None,
    force: bool = False,
    notify: Callable[[str], None] = lambda message: None,
) -> TrainResult | None:
    """Train every phase (resuming from ``checkpoint_dir`` if a checkpoint of the same
    config exists), evaluate the variant table and write the artifact atomically.

    Returns None on non-zero ranks of a multi-GPU run (rank 0 writes the artifact).
    """
    out_dir = Path(out_dir)
    checkpoint_dir = checkpoint_dir or default_checkpoint_dir(out_dir)
    check_training_outputs(config, out_dir, checkpoint_dir, force=force)
    trained = train_supernet_model(
        config,
        checkpoint_dir=checkpoint_dir,
        restart=restart,
        cache_dir=cache_dir,
        progress=progress,
        stop_after_epochs=stop_after_epochs,
        notify=notify,
    )
    if not trained.ctx.is_main:
        return None
    table = _variant_table(trained, config, progress)
    metrics = _training_metrics(trained, table, loader_epoch_s=_loader_epoch_s(trained, config))
    _write_artifact(out_dir, config, trained, table, metrics, force=force)
    if not keep_checkpoint:
        release_checkpoint_dir(checkpoint_dir)
    return TrainResult(out_dir=out_dir, metrics=metrics, variants=table)


def _channels_last(trained: TrainedSupernet) -> bool:
    return trained.device.type == "cuda" and trained.dataset.info.modality == "image"


def _variant_table(trained: TrainedSupernet, config: TrainConfig, progress: ProgressCallback) -> Any:
    """The evaluated variants (largest, smallest and a seeded sample), each recalibrated on the
    calibration subset and scored on the validation and test sets: a pandas DataFrame."""
    from hmt.data import batches_of, eval_loader
    from hmt.supernet.train.report import pick_variants, variant_table

    net, data, device = trained.net, trained.dataset, trained.device
    channels_last = _channels_last(trained)

    def evaluation(x: np.ndarray, y: np.ndarray | None) -> BatchLoader:
        return eval_loader(
            x, y, info=data.info, batch_size=config.eval_batch_size, device=device, channels_last=channels_last
        )

    val_loader = evaluation(*trained.val)
    test_loader = evaluation(data.test_x, data.test_y)
    variants = pick_variants(net, config.eval_variants, np.random.default_rng(derive_seed(config.seed, 6)))
    calibration = batches_of(evaluation(trained.calibration_x, None))
    return variant_table(
        net,
        variants,
        val_loader=val_loader,
        test_loader=test_loader,
        calibration=calibration,
        autocast=device.type == "cuda" and config.amp,
        progress=progress,
    )


def _loader_epoch_s(trained: TrainedSupernet, config: TrainConfig) -> float:
    """Seconds the training loader alone takes for one epoch of the whole training set."""
    from hmt.supernet.train.report import loader_epoch_s

    data = trained.dataset
    train_loader = BatchLoader(
        data.train_x,
        data.train_y,
        info=data.info,
        batch_size=config.batch_size,
        device=trained.device,
        augment=True,
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
        channels_last=_channels_last(trained),
    )
    return loader_epoch_s(train_loader, trained.device)


def _training_metrics(trained: TrainedSupernet, table: Any, *, loader_epoch_s: float) -> dict[str, Any]:
    """The artifact's metrics: the largest and smallest variants' accuracy and size, and the
    training run's time, throughput and data-loading share."""
    net, data, device = trained.net, trained.dataset, trained.device
    timed = [h for h in trained.state.history if "epoch_s" in h]
    largest = table[table.role == "largest"].iloc[0]
    smallest = table[table.role == "smallest"].iloc[0]
    per_image_s = [h["epoch_s"] / max(1, h["images_per_s"] * h["epoch_s"]) for h in timed]
    return {
        "largest_val_acc": float(largest.val_acc),
        "largest_test_acc": float(largest.test_acc),
        "smallest_val_acc": float(smallest.val_acc),
        "smallest_test_acc": float(smallest.test_acc),
        "largest_params": int(largest.params),
        "smallest_params": int(smallest.params),
        "variants_evaluated": len(table),
        "space_size": net.space.size(),
        "train_wall_s": trained.wall_s,
        "train_epochs": len(timed),
        "train_images_per_s_median": float(np.median([h["images_per_s"] for h in timed])) if timed else None,
        "loader_epoch_s": loader_epoch_s,
        # The loader alone vs a training epoch over the same number of images: an upper
        # bound on the share of step time spent waiting for data.
        "data_wait_share": (loader_epoch_s / (float(np.median(per_image_s)) * len(data.train_x))) if timed else None,
        "partition_acc": trained.state.partition_acc,
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "world_size": trained.ctx.world_size,
    }


def _write_artifact(out_dir: Path, config: TrainConfig, trained: TrainedSupernet, table: Any,
                    metrics: dict[str, Any], *, force: bool) -> None:
    """Write the supernet artifact atomically: weights, search space, model info, variant
    table, calibration subset, training history and curves, metrics."""
    from safetensors.torch import save_file

    from hmt.supernet.train.report import plot_curves

    net, data, history = trained.net, trained.dataset, trained.state.history
    with ArtifactWriter(out_dir, kind=KIND, config=portable_config(config.to_json_dict(), out_dir),
                        inputs=[p for p in (config.data_path, config.pretrained) if p], force=force) as writer:
        state = weights_for_file(net)
        save_file(state, str(writer.path(WEIGHTS)))
        writer.write_json(SPACE, net.space.to_json_dict())
        writer.write_bytes(
            MODEL,
            write_model_info(
                config.backbone,
                data.info.num_classes,
                data.info.input_shape,
                config.operators,
                data.info.to_artifact_dict(),
            ).encode(),
        )
        table.to_csv(writer.path(VARIANTS), index=False)
        np.savez(writer.path(CALIBRATION), x=trained.calibration_x)
        writer.write_json(HISTORY, history)
        plot_curves(history, writer.path(CURVES))
        writer.metrics.update(metrics)
