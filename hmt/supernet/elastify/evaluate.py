"""The elastified supernet's variant table: the original's test accuracy, then the
largest, the smallest, random variants and the width levels (every stream width with
every inner width, at the last exit: the ladder a front is read against)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from hmt.data import BatchLoader
from hmt.progress import ProgressCallback
from hmt.supernet.calibrate import mixed
from hmt.supernet.elastify.supernet import ElastifiedSupernet
from hmt.supernet.space import WIDTH_KIND, WIDTH_RATIOS, ArchConfig, SearchSpace
from hmt.supernet.train.config import TrainConfig


def level_variants(space: SearchSpace, taken: set[str]) -> list[tuple[str, ArchConfig]]:
    """Uniform width levels: one stream width for every stage and one inner width for
    every block (where offered), at the last exit; those ``taken`` already are left out."""
    streams = sorted({c for p in space.positions if p.kind == WIDTH_KIND for c in p.choices}, key=WIDTH_RATIOS.get)
    inners = sorted({c for p in space.positions if p.kind != WIDTH_KIND for c in p.choices if c in WIDTH_RATIOS},
                    key=WIDTH_RATIOS.get)
    out: list[tuple[str, ArchConfig]] = []
    for stream in streams or ["base"]:
        for inner in inners or ["base"]:
            picks = [(stream if p.kind == WIDTH_KIND else inner) if (stream if p.kind == WIDTH_KIND else inner)
                     in p.choices else "base" for p in space.positions]
            arch = space.make(picks)
            if arch.arch_id not in taken:
                taken.add(arch.arch_id)
                out.append(("level", arch))
    return out


@torch.no_grad()
def accuracy(fn: Callable[[torch.Tensor], torch.Tensor], loader: BatchLoader, *, autocast: bool = False) -> float:
    """Top-1 accuracy, under the same autocast the variant table uses (hmt.supernet.train.evaluate)."""
    correct, seen = 0, 0
    loader.set_epoch(0)
    for xb, yb in loader:
        with torch.autocast(device_type=xb.device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = fn(xb)
        correct += int((logits.argmax(1) == yb).sum())
        seen += len(yb)
    return correct / max(1, seen)



def evaluate(
    net: ElastifiedSupernet,
    model: nn.Module,
    evaluation: Callable[[np.ndarray, np.ndarray | None], BatchLoader],
    val: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    calibration_x: np.ndarray,
    config: TrainConfig,
    *,
    channels_last: bool,
    autocast: bool,
    progress: ProgressCallback,
) -> tuple[float, Any]:
    """The original's test accuracy and the variant table (largest, smallest, random)."""
    from hmt.data import batches_of
    from hmt.supernet.train.report import pick_variants, variant_table
    from hmt.supernet.train.trainer import derive_seed

    test_loader = evaluation(*test)
    # The original runs as the table's largest variant runs (device, memory format, autocast),
    # so that equal weights give equal predictions, not merely close ones.
    model.to(next(net.parameters()).device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    original_test_acc = accuracy(model, test_loader, autocast=autocast)
    variants = pick_variants(net, config.eval_variants,
                             np.random.default_rng(derive_seed(config.seed, 6)))
    variants += level_variants(net.space, {arch.arch_id for _, arch in variants})
    table = variant_table(net, variants, val_loader=evaluation(*val), test_loader=test_loader,
                          calibration=batches_of(evaluation(mixed(calibration_x), None)), autocast=autocast,
                          progress=progress)
    return original_test_acc, table


def table_metrics(table: Any) -> dict[str, Any]:
    largest = table[table.role == "largest"].iloc[0]
    smallest = table[table.role == "smallest"].iloc[0]
    return {
        "largest_val_acc": float(largest.val_acc),
        "largest_test_acc": float(largest.test_acc),
        "smallest_val_acc": float(smallest.val_acc),
        "smallest_test_acc": float(smallest.test_acc),
        "largest_params": int(largest.params),
        "smallest_params": int(smallest.params),
    }


