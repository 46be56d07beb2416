"""Test-time adaptation benchmark: accuracy per corruption before/after, clean accuracy after,
adaptation time per batch, peak training memory of the memory-saving engine vs plain autograd.

    PYTHONPATH=$PWD python3 scripts/make_corruptions.py --data ../shared/datasets/cifar10-jpeg --out runs/cifar10-c
    PYTHONPATH=$PWD python3 scripts/bench_adapt.py --supernet runs/r20 --data runs/cifar10-c \
        --arch largest --arch smallest --severity 5 --limit 2000 --out runs/bench-adapt.json

For each variant and set: the source model, BN re-estimation and TENT (one online pass,
batch --batch-size, Adam lr --lr), each measured on the same images (a class-balanced
subset of --limit images when given). Peak memory: one TENT step at --batch-size, plain
autograd vs the engine (8-bit saved activations, updates in backward, and with
recomputation under a budget of --budget-fraction of the compressed estimate), measured
by the torch profiler's allocation events on a CPU, max_memory_allocated on CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hmt.adapt.corruptions import NOISE_AND_BLUR, load_shift_set, set_name
from hmt.adapt.memory import EngineOptions, as_chain, plan_checkpoints
from hmt.adapt.run import AdaptOptions, adapt_set, balanced_split, normalize, training_peak_bytes
from hmt.adapt.tent import TentOptions, configure_for_tent
from hmt.errors import BudgetError
from hmt.supernet import load_supernet


def machine() -> str:
    from hmt.profile.parsers import parse_cpuinfo

    try:
        cpu = parse_cpuinfo(Path("/proc/cpuinfo").read_text()).get("model", platform.processor())
    except (OSError, AttributeError):
        cpu = platform.processor()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores{gpu}, load average {load:.1f} at start, torch {torch.__version__}"


def memory_rows(model: torch.nn.Module, batch: torch.Tensor, fraction: float, repeats: int) -> dict[str, object]:
    probe = __import__("copy").deepcopy(model)
    configure_for_tent(probe)
    plan = plan_checkpoints(as_chain(probe), batch, None, compress=True,
                            exclude=[*probe.parameters(), *probe.buffers()])
    budget = int(plan.estimated_bytes * fraction)
    engines = {
        "plain autograd": EngineOptions(compress=False, update_in_backward=False),
        "8-bit + update in backward": EngineOptions(compress=True, update_in_backward=True),
        f"8-bit + recompute (budget {fraction:g}x) + update in backward": EngineOptions(
            compress=True, budget_bytes=budget, update_in_backward=True),
    }
    peaks: dict[str, list[int]] = {k: [] for k in engines}
    times: dict[str, list[float]] = {k: [] for k in engines}
    refused: dict[str, str] = {}
    for _ in range(repeats):  # interleaved, so a load change on the shared machine hits all alike
        for name, engine in engines.items():
            if name in refused:
                continue
            start = time.perf_counter()
            try:
                peaks[name].append(training_peak_bytes(model, batch, engine))
            except BudgetError as exc:  # recomputation cannot reach this budget: say so
                refused[name] = str(exc)
            times[name].append(time.perf_counter() - start)
    plain = float(np.median(peaks["plain autograd"]))
    rows: dict[str, object] = {name: {"peak_bytes_median": float(np.median(v)),
                                      "ratio_vs_plain": float(np.median(v)) / plain, "peaks": v}
                               for name, v in peaks.items() if v}
    return rows | {name: {"refused": msg} for name, msg in refused.items()} | {"budget_bytes": budget}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a shift set (scripts/make_corruptions.py)")
    parser.add_argument("--arch", action="append", help="arch id, 'largest' or 'smallest' (repeatable)")
    parser.add_argument("--severity", type=int, action="append", help="severities to run (default 5)")
    parser.add_argument("--limit", type=int, default=None, help="class-balanced subset of each set")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--method", action="append", choices=["bn", "tent"])
    parser.add_argument("--budget-fraction", type=float, default=0.5)
    parser.add_argument("--memory-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (peak memory: max_memory_allocated)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_supernet(args.supernet, device=args.device)
    info = loaded.dataset_info
    shift = load_shift_set(args.data)
    names = ["clean", *[set_name(c, s) for s in (args.severity or [5]) for c in
                        ("gaussian_noise", "shot_noise", "defocus_blur", "brightness", "contrast", "jpeg_compression")]]
    keep = np.arange(len(shift.labels)) if args.limit is None else balanced_split(shift.labels, args.limit)[0]
    labels = shift.labels[keep]
    report: dict[str, object] = {"machine": machine(), "command": " ".join(sys.argv), "images_per_set": len(keep),
                                 "variants": {}}
    for arch_arg in args.arch or ["largest", "smallest"]:
        arch = {"largest": loaded.space.largest, "smallest": loaded.space.smallest}.get(arch_arg, lambda: None)()
        arch = arch or loaded.space.parse(arch_arg)
        model = loaded.materialize(arch)
        rows = {}
        for method in args.method or ["bn", "tent"]:
            options = AdaptOptions(method=method, batch_size=args.batch_size, tent=TentOptions(lr=args.lr))
            for name in names:
                x = normalize(shift.sets[name][keep], info["mean"], info["std"]).to(args.device)
                result, _ = adapt_set(model, name, x, labels, options)
                rows[f"{method}/{name}"] = result.to_json_dict()
                print(f"{arch.arch_id} {method:4s} {name:22s} {result.accuracy_before:.4f} -> "
                      f"{result.accuracy_after:.4f} (online {result.accuracy_online}) "
                      f"{result.adapt_ms_per_batch:.0f} ms/batch", file=sys.stderr, flush=True)
        batch = normalize(shift.sets[set_name("gaussian_noise", (args.severity or [5])[0])][keep[:args.batch_size]],
                          info["mean"], info["std"]).to(args.device)
        memory = memory_rows(model, batch, args.budget_fraction, args.memory_repeats)
        print(f"{arch.arch_id} memory {json.dumps(memory)}", file=sys.stderr, flush=True)
        report["variants"][arch.arch_id] = {"results": rows, "memory": memory}  # type: ignore[index]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(markdown(report))
    return 0


def markdown(report: dict[str, object]) -> str:
    lines = [f"machine: {report['machine']}; images per set: {report['images_per_set']}", ""]
    for arch_id, body in report["variants"].items():  # type: ignore[attr-defined]
        results = body["results"]
        methods = sorted({k.split("/")[0] for k in results})
        sets = [k.split("/", 1)[1] for k in results if k.startswith(methods[0] + "/")]
        lines += [f"**{arch_id}**", "", "| set | source | " + " | ".join(methods) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in methods) + " |"]
        for name in sets:
            src = results[f"{methods[0]}/{name}"]["accuracy_before"]
            cells = [f"{100 * results[f'{m}/{name}']['accuracy_after']:.2f}" for m in methods]
            lines.append(f"| {name} | {100 * src:.2f} | " + " | ".join(cells) + " |")
        for m in methods:
            gains = [results[f"{m}/{n}"]["accuracy_after"] - results[f"{m}/{n}"]["accuracy_before"]
                     for n in sets if n.split("-s")[0] in NOISE_AND_BLUR and n.endswith("-s5")]
            clean = results.get(f"{m}/clean")
            ms = np.median([results[f"{m}/{n}"]["adapt_ms_per_batch"] for n in sets])
            lines.append(f"- {m}: mean gain on noise+blur s5 {100 * np.mean(gains):+.2f} points; clean "
                         f"{100 * (clean['accuracy_after'] - clean['accuracy_before']):+.2f} points; "
                         f"median {ms:.0f} ms per batch" if gains and clean else f"- {m}")
        for name, row in body["memory"].items():
            if isinstance(row, dict) and "refused" in row:
                lines.append(f"- peak memory {name}: refused ({row['refused']})")
            elif isinstance(row, dict):
                lines.append(f"- peak memory {name}: {row['peak_bytes_median'] / 2**20:.1f} MiB "
                             f"({row['ratio_vs_plain']:.2f}x plain)")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
