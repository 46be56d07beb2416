"""Accuracy of an architecture at every exit up to its own, over a loader."""

from __future__ import annotations

import torch

from hmt.data import BatchLoader
from hmt.supernet.space import ArchConfig
from hmt.supernet.supernet import Supernet


@torch.no_grad()
def evaluate_exits(net: Supernet, arch: ArchConfig, loader: BatchLoader, *, autocast: bool = False) -> list[float]:
    """Top-1 accuracy (fraction) at exits 0..arch.exit_stage."""
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
