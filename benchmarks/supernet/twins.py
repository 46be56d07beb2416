"""Benchmark a trained supernet against standalone twins (issue: train-supernet benchmarks).

Picks the largest variant and the most accurate variants (validation accuracy) at
<= 0.3 M and <= 1 M parameters from the artifact's table, trains each architecture
alone with the same recipe for the same total number of epochs, and writes a JSON with
both test accuracies side by side plus the artifact's throughput figures.

    python -m benchmarks.supernet.twins --supernet runs/r18 --data DIR --out benchmarks/supernet/cifar10.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import pandas as pd
import torch

from benchmarks.harness import Driver
from hmt.data import load_dataset
from hmt.supernet import load_supernet
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.standalone import train_standalone

BENCH = Driver(
    baseline="each picked architecture trained alone with the same recipe for the same epochs",
    needs="a trained supernet and its data (--supernet, --data)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--twin-epochs", type=int, default=None, help="default: the supernet's total epochs")
    parser.add_argument("--budgets-m", default="0.3,1.0", help="parameter budgets in millions")
    args = parser.parse_args()

    loaded = load_supernet(args.supernet)
    manifest = loaded.artifact.manifest
    config = TrainConfig(
        **{k: (tuple(v) if k == "operators" and v is not None else v) for k, v in manifest.config.items()}
    )
    table = pd.read_csv(loaded.artifact.file("variants.csv"))
    picks = [("largest", table[table.role == "largest"].iloc[0])]
    for budget in (float(b) for b in args.budgets_m.split(",")):
        within = table[table.params <= budget * 1e6]
        if len(within):
            picks.append((f"best <= {budget} M params", within.sort_values("val_acc", ascending=False).iloc[0]))
    history = loaded.artifact.read_json("history.json")
    total_epochs = sum(1 for h in history if "train_loss" in h)
    twin_epochs = args.twin_epochs or total_epochs
    data = load_dataset(config.dataset, args.data)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for label, row in picks:
        arch = loaded.space.parse(row.arch_id)
        twin = train_standalone(arch, data, config, epochs=twin_epochs, device=device, lr=config.backbone_lr)
        rows.append(
            {
                "variant": label,
                "arch_id": row.arch_id,
                "params": int(row.params),
                "macs": int(row.macs),
                "exit_stage": int(row.exit_stage),
                "supernet_test_acc": float(row.test_acc),
                **{
                    f"supernet_test_acc_exit{e}": float(row[f"test_acc_exit{e}"])
                    for e in range(loaded.space.num_stages)
                    if not pd.isna(row[f"test_acc_exit{e}"])
                },
                "standalone_test_acc": twin.test_acc,
                "standalone_epochs": twin.epochs,
                "standalone_wall_s": twin.wall_s,
                "delta_points": 100 * (float(row.test_acc) - twin.test_acc),
            }
        )
        print(json.dumps(rows[-1]))
    result = {
        "machine": {
            "platform": platform.platform(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__,
        },
        "supernet": str(args.supernet),
        "supernet_metrics": manifest.metrics,
        "config": manifest.config,
        "supernet_total_epochs": total_epochs,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
