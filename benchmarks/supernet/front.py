"""Evaluate many variants of a trained supernet on the 10k test images (issue 11).

Each variant is materialised and its BN statistics re-estimated on the artifact's stored
calibration images (what convert ships), then scored at its exit on the supernet's validation split
(what a variant is chosen on; rebuilt from ``--data``, checked by sha256) and on the test split (which
only reports), also per seeded half (``test_a_acc``, ``test_b_acc``: for an original that was trained on
every training image, validation included, half A chooses and half B reports).
Variants: the largest; structured families (every stream width x every inner width, with
and without the skippable blocks); and ``--random`` uniform samples at the last exit and
at random exits, all from a seeded generator. MACs and parameters are counted on the
materialised module. Rows are appended as they are measured, so a cut-off run keeps them.

    python -m benchmarks.supernet.front --supernet runs/r18 --data ../shared/datasets/cifar10-jpeg \\
        --random 150 --out runs/r18-front.csv
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.harness import Driver
from hmt.data import eval_loader, load_dataset
from hmt.supernet import load_supernet
from hmt.supernet.space import WIDTH_KIND, ArchConfig, SearchSpace
from hmt.supernet.train.evaluate import evaluate_variant


def count_macs(module: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """(multiply-accumulates, parameters) of one forward at batch 1 (convs and linears)."""
    macs = 0

    def hook(layer: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal macs
        if isinstance(layer, (nn.Conv1d, nn.Conv2d)):
            per_out = layer.in_channels // layer.groups * int(np.prod(layer.kernel_size))
            macs += int(out[0].numel()) * per_out
        elif isinstance(layer, nn.Linear):
            macs += layer.in_features * layer.out_features

    layers = [m for m in module.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear))]
    handles = [m.register_forward_hook(hook) for m in layers]
    device = next(module.parameters()).device
    with torch.no_grad():
        module(torch.zeros(1, *input_shape, device=device))
    for h in handles:
        h.remove()
    return macs, sum(p.numel() for p in module.parameters())


def structured_archs(space: SearchSpace) -> list[ArchConfig]:
    """Uniform families: stream width x inner width x (all blocks | skippable ones skipped)."""
    out = [space.largest()]
    stream = next((p.choices for p in space.positions if p.kind == WIDTH_KIND), ("base",))
    for sw in stream:
        for iw in ("base", "w75", "w50", "w25"):
            for skip in (False, True):
                picks = []
                for pos in space.positions:
                    if pos.kind == WIDTH_KIND:
                        picks.append(sw)
                    elif skip and "skip" in pos.choices:
                        picks.append("skip")
                    else:
                        picks.append(iw if iw in pos.choices else "base")
                out.append(space.make(picks))
    return out


BENCH = Driver(
    baseline="the largest variant (the original) on the same test images",
    needs="a trained supernet and its data (--supernet, --data); writes a CSV",
    report="{tmp}/front.csv",
    out_args=("--out", "{tmp}/front.csv"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--out", type=Path, required=True, help="CSV, one row per variant")
    parser.add_argument("--random", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-test", type=int, default=None, help="cap on test images (CPU smoke runs)")
    parser.add_argument("--arch", action="append", default=[], help="also evaluate this arch id (repeatable)")
    parser.add_argument("--table-only", action="store_true",
                        help="evaluate only the variants the supernet's variants.csv lists (a specialized supernet: "
                             "its other variants share weights with the specialized ones and are not meant to be used)")
    parser.add_argument("--greedy", type=int, default=0,
                        help="also the greedy shrinking path from the largest at every exit (hmt.pareto.greedy, "
                             "next cheaper choice per block, chosen on validation images): evaluations per exit")
    parser.add_argument("--greedy-samples", type=int, default=2500, help="validation images the path is chosen on")
    args = parser.parse_args()

    loaded = load_supernet(args.supernet, device=args.device)
    space = loaded.space
    data = load_dataset(loaded.dataset_info["name"], args.data)
    test_x, test_y = data.test_x, data.test_y
    if args.max_test:
        test_x, test_y = test_x[: args.max_test], test_y[: args.max_test]
    # Two seeded halves of the test images: an original pretrained on every training image has seen
    # the validation split, so for it variants are chosen on half A and reported on half B.
    halves = np.array_split(np.random.default_rng(args.seed).permutation(len(test_y)), 2)
    loaders = [eval_loader(test_x[h], test_y[h], info=data.info, batch_size=500, device=torch.device(args.device),
                           channels_last=False) for h in halves]
    from hmt.pareto.data import held_out_data

    val = held_out_data(loaded, data_path=args.data, split="val", max_samples=args.max_test, seed=args.seed)
    val_loader = eval_loader(val.x, val.y, info=data.info, batch_size=500, device=torch.device(args.device),
                             channels_last=False)
    rng = np.random.default_rng(args.seed)
    if args.table_only:
        import pandas as pd

        from hmt.supernet.artifact import VARIANTS

        listed = pd.read_csv(loaded.artifact.file(VARIANTS)).arch_id
        archs = [space.parse(str(a)) for a in listed] + [space.parse(a) for a in args.arch]
    else:
        archs = structured_archs(space) + [space.parse(a) for a in args.arch]
    archs += [space.sample(rng, exit_stage=space.num_stages - 1) for _ in range(args.random)]
    archs += [space.sample(rng) for _ in range(args.random // 3)]
    if args.greedy:
        archs += greedy_archs(loaded, args)
    seen: set[str] = set()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["arch_id", "exit_stage", "val_acc", "test_acc", "test_a_acc", "test_b_acc", "macs",
                         "params", "eval_s"])
        for arch in archs:
            if arch.arch_id in seen:
                continue
            seen.add(arch.arch_id)
            started = time.perf_counter()
            variant = loaded.materialize(arch)
            acc_a, acc_b = (evaluate_variant(variant, half)[-1] for half in loaders)
            acc = (acc_a * len(halves[0]) + acc_b * len(halves[1])) / len(test_y)
            val_acc = evaluate_variant(variant, val_loader)[-1]
            macs, params = count_macs(variant, tuple(space.input_shape))
            writer.writerow([arch.arch_id, arch.exit_stage, f"{val_acc:.4f}", f"{acc:.4f}", f"{acc_a:.4f}",
                             f"{acc_b:.4f}", macs, params, f"{time.perf_counter() - started:.2f}"])
            handle.flush()


def greedy_archs(loaded: object, args: argparse.Namespace) -> list[ArchConfig]:
    """The greedy path's variants from the largest at every exit, chosen on a stratified subset
    of the supernet's validation split (BN re-estimated on the stored calibration set)."""
    from hmt.pareto.data import calibration_batches, device_batches, held_out_data
    from hmt.pareto.evaluate import PrefixEvaluator
    from hmt.pareto.greedy import greedy_path

    net = loaded.net  # type: ignore[attr-defined]
    space = loaded.space  # type: ignore[attr-defined]
    val = held_out_data(loaded, data_path=args.data, split="val", max_samples=args.greedy_samples, seed=args.seed)
    evaluator = PrefixEvaluator(net, device_batches(val, batch_size=500, device=args.device),
                                calibration=calibration_batches(loaded, device=args.device))
    macs: dict[str, float] = {}

    def cost(arch: ArchConfig) -> float:
        if arch.arch_id not in macs:
            macs[arch.arch_id] = float(count_macs(loaded.materialize(arch), tuple(space.input_shape))[0])  # type: ignore[attr-defined]
        return macs[arch.arch_id]

    out: list[ArchConfig] = []
    for exit_stage in range(space.num_stages):
        start = space.make(["base"] * len(space.positions), exit_stage)
        path = greedy_path(space, lambda archs: [a.accuracy for a in evaluator.evaluate(archs)], cost,
                           start=start, max_drop=0.06, max_evaluations=args.greedy, moves="next")
        print(f"greedy path from exit {exit_stage}: {len(path)} variants, {path[-1].evaluations} evaluated",
              flush=True)
        out += [step.arch for step in path]
    return out


if __name__ == "__main__":
    main()
