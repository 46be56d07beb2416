"""Accuracy of an architecture at every exit up to its own, over a loader."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hmt.data import BatchLoader
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
