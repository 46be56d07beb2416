"""Train networks alone (issue 11's twins and standalone baselines) and report test accuracy.

A job is ``NAME=BACKBONE[:ARCH_ID]``: the backbone's largest architecture (the plain
network), or one architecture of the space given by ``--operators`` (a supernet
variant's twin). Every job uses the recipe of ``--preset`` (optimiser, schedule,
augmentation, batch) for ``--epochs`` epochs, from random initialisation.

    python -m benchmarks.supernet.standalone --data ../shared/datasets/cifar10-jpeg --epochs 170 \\
        --job resnet20=cifar_resnet20 --job mbv2=mobilenetv2 --out runs/standalone.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from pathlib import Path

import torch

from benchmarks.harness import Driver
from hmt.data import load_dataset
from hmt.supernet.supernet import build_supernet
from hmt.supernet.train.config import resolve_config
from hmt.supernet.train.standalone import train_standalone

BENCH = Driver(
    baseline="(none: trains each network alone; the supernet's variant is the comparison)",
    needs="CIFAR-10 and a GPU (--data, --job)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--preset", default="cifar10")
    parser.add_argument("--operators", default="", help="comma-separated; the space an ARCH_ID belongs to")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--lr", type=float, default=None, help="default: the preset's backbone_lr")
    parser.add_argument("--job", action="append", required=True, help="NAME=BACKBONE[:ARCH_ID]")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="resumable: a checkpoint per job after every epoch; rerun to continue")
    parser.add_argument("--max-train", type=int, default=None, help="cap (CPU smoke runs)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = load_dataset("cifar10", args.data)
    results = []
    for job in args.job:
        name, _, spec = job.partition("=")
        backbone, _, arch_id = spec.partition(":")
        operators = tuple(o for o in args.operators.split(",") if o) if arch_id else ()
        config = dataclasses.replace(
            resolve_config(preset=args.preset), backbone=backbone, operators=operators,
            max_train_samples=args.max_train,
        )
        net = build_supernet(backbone, num_classes=10, input_shape=data.info.input_shape, operators=operators)
        arch = net.space.parse(arch_id) if arch_id else net.space.largest()
        result = train_standalone(arch, data, config, epochs=args.epochs, device=device,
                                  lr=args.lr or config.backbone_lr,
                                  checkpoint_dir=args.checkpoint_dir / name if args.checkpoint_dir else None)
        results.append({"name": name, "backbone": backbone, "arch_id": arch.arch_id, "epochs": args.epochs,
                        "test_acc": result.test_acc, "wall_s": result.wall_s})
        args.out.write_text(json.dumps({"machine": torch.cuda.get_device_name() if device.type == "cuda"
                                        else platform.processor(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
