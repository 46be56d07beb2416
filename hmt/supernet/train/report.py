"""The per-variant table and the training-curves plot of a supernet artifact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from hmt.data import BatchLoader
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.metrics import measure_cost
from hmt.supernet.space import ArchConfig
from hmt.supernet.supernet import Supernet
from hmt.supernet.train.evaluate import calibrated_variant, evaluate_variant


def pick_variants(net: Supernet, count: int, rng: np.random.Generator) -> list[tuple[str, ArchConfig]]:
    """Largest, smallest and ``count`` distinct random variants (fewer if the space is small)."""
    picked: dict[str, tuple[str, ArchConfig]] = {}
    for role, arch in (("largest", net.space.largest()), ("smallest", net.space.smallest())):
        picked.setdefault(arch.arch_id, (role, arch))
    attempts = 0
    while len(picked) < count + 2 and attempts < 50 * (count + 2):
        arch = net.space.sample(rng)
        picked.setdefault(arch.arch_id, ("random", arch))
        attempts += 1
    return list(picked.values())


def variant_table(
    net: Supernet,
    variants: list[tuple[str, ArchConfig]],
    *,
    val_loader: BatchLoader,
    test_loader: BatchLoader,
    calibration: list[torch.Tensor],
    autocast: bool,
    progress: ProgressCallback = no_progress,
) -> pd.DataFrame:
    """Accuracy per exit of each variant, materialised with its own BN statistics."""
    rows: list[dict[str, Any]] = []
    input_shape = tuple(net.space.input_shape)
    for i, (role, arch) in enumerate(variants):
        variant = calibrated_variant(net, arch, calibration)
        val_acc = evaluate_variant(variant, val_loader, autocast=autocast)
        test_acc = evaluate_variant(variant, test_loader, autocast=autocast)
        cost = measure_cost(variant.cpu().float(), input_shape)
        row: dict[str, Any] = {"arch_id": arch.arch_id, "role": role, "exit_stage": arch.exit_stage}
        for e in range(net.space.num_stages):
            row[f"val_acc_exit{e}"] = val_acc[e] if e < len(val_acc) else np.nan
        for e in range(net.space.num_stages):
            row[f"test_acc_exit{e}"] = test_acc[e] if e < len(test_acc) else np.nan
        row["val_acc"] = val_acc[-1]
        row["test_acc"] = test_acc[-1]
        row.update(cost.summary())
        row["config"] = json.dumps(arch.to_json_dict(), sort_keys=True)
        rows.append(row)
        progress("evaluate variants", i + 1, len(variants), arch.arch_id)
    return pd.DataFrame(rows)


def plot_curves(history: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [h for h in history if "train_loss" in h]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(1, len(records) + 1)
    phases = [r["phase"] for r in records]
    ax_loss.plot(x, [r["train_loss"] for r in records], marker=".")
    ax_loss.set_xlabel("epoch (all phases)")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_yscale("log")
    acc_x = [xi for xi, r in zip(x, records, strict=True) if "val_acc" in r]
    ax_acc.plot(
        acc_x, [100 * r["val_acc"] for r in records if "val_acc" in r], marker=".", label="largest / partition exit"
    )
    small = [(xi, 100 * r["val_acc_smallest"]) for xi, r in zip(x, records, strict=True) if "val_acc_smallest" in r]
    if small:
        ax_acc.plot(*zip(*small, strict=True), marker=".", label="smallest")
    ax_acc.set_xlabel("epoch (all phases)")
    ax_acc.set_ylabel("validation accuracy (%)")
    ax_acc.legend()
    # Shade phases so the recipe's stages read off the plot.
    start = 0
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            for ax in (ax_loss, ax_acc):
                ax.axvspan(
                    start + 0.5, i + 0.5, alpha=0.08 if (len({p for p in phases[:start]}) % 2) else 0.0, color="k"
                )
            ax_acc.annotate(phases[start], (start + 1, ax_acc.get_ylim()[0]), fontsize=7, rotation=90, va="bottom")
            start = i
    fig.suptitle("supernet training curves")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def loader_epoch_s(loader: BatchLoader, device: torch.device) -> float:
    """Time to produce one epoch of batches alone: the loader's share of an epoch."""
    import time

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for xb, _ in loader:
        xb.sum()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
