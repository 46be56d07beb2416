"""Accuracy of an architecture at every exit up to its own, over a loader."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from hmt.data import BatchLoader, DatasetInfo
from hmt.supernet.calibrate import recalibrate_bn
from hmt.supernet.space import ArchConfig
from hmt.supernet.supernet import Supernet, VariantModule


@torch.no_grad()
def evaluate_exits(net: Supernet, arch: ArchConfig, loader: BatchLoader, *, autocast: bool = False) -> list[float]:
    """Top-1 accuracy (fraction) at exits 0..arch.exit_stage through the supernet's shared
    BN statistics (right for the largest network, whose statistics they are)."""
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    correct = torch.zeros(arch.exit_stage + 1, dtype=torch.long, device=device)
    seen = 0
    loader.set_epoch(0)
    for xb, yb in loader:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = net.forward_exits(xb, arch)
        for i, out in enumerate(logits):
            correct[i] += (out.argmax(1) == yb).sum()
        seen += len(yb)
    net.train(was_training)
    return [float(c) / max(1, seen) for c in correct.tolist()]


def calibrated_variant(net: Supernet, arch: ArchConfig, calibration: Iterable[torch.Tensor]) -> VariantModule:
    """The materialised variant with its own BN statistics (hmt.supernet.calibrate)."""
    variant = net.materialize(arch)
    recalibrate_bn(variant, calibration)
    return variant.eval()


@torch.no_grad()
def evaluate_variant(variant: VariantModule, loader: BatchLoader, *, autocast: bool = False) -> list[float]:
    """Top-1 accuracy (fraction) at every exit of a materialised variant."""
    device = next(variant.parameters()).device
    correct = torch.zeros(len(variant.exit_heads), dtype=torch.long, device=device)
    seen = 0
    loader.set_epoch(0)
    for xb, yb in loader:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = variant.forward_all(xb)
        for i, out in enumerate(logits):
            correct[i] += (out.argmax(1) == yb).sum()
        seen += len(yb)
    return [float(c) / max(1, seen) for c in correct.tolist()]


def eval_loader(
    x: np.ndarray,
    y: np.ndarray | None,
    *,
    info: DatasetInfo,
    batch_size: int,
    device: torch.device,
    channels_last: bool,
) -> BatchLoader:
    """A loader for evaluation or calibration: in order, no augmentation (labels optional)."""
    labels = np.zeros(len(x), dtype=np.int64) if y is None else y
    return BatchLoader(
        x,
        labels,
        info=info,
        batch_size=batch_size,
        device=device,
        augment=False,
        shuffle=False,
        generator=torch.Generator().manual_seed(0),
        channels_last=channels_last,
    )


def batches_of(loader: BatchLoader) -> list[torch.Tensor]:
    loader.set_epoch(0)
    return [xb for xb, _ in loader]
