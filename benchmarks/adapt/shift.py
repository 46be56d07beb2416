"""Test-time adaptation benchmark: accuracy per corruption before/after, clean accuracy after,
adaptation time per batch, peak training memory of the memory-saving engine vs plain autograd.

One command from the CIFAR-10 JPEG source (the GPU host: ``--source CIFAR10_JPEG``)::

    PYTHONPATH=$PWD python -m benchmarks.adapt.shift --supernet hmt/data/embedded/supernet-cifar-resnet56 \
        --source CIFAR10_JPEG --data runs/cifar10-c --arch largest \
        --arch cifar_resnet56-03130f.e1.55S5B7777757S5555575xxxxxxxxxx --severity 3 --severity 5 \
        --device cuda --out-dir $OUT/adapt

``--source`` makes the shift set at ``--data`` first when it is not there
(``scripts/make_corruptions.py``'s function: the six corruptions at the given severities,
seed 0, ``--workers`` processes), so the corruptions are made on the machine that runs the
benchmark. For each variant and set: the source model, BN re-estimation and TENT (one
online pass, batch --batch-size, Adam lr --lr), each measured on the same images (a
class-balanced subset of --limit images when given). "clean" is adaptation on clean test
images from the source model: what adapting costs when nothing shifted. Peak memory: one
TENT step at --batch-size, every engine mode in a fresh subprocess
(``benchmarks/adapt/memory.py``: saved-tensor bytes, allocator peak, and on a CPU the
resident peak). Writes ``bench-adapt.json`` and ``bench-adapt.md`` to --out-dir after
every variant (a run cut short keeps what it finished).
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

from benchmarks.harness import Driver
from hmt.adapt.corruptions import NOISE_AND_BLUR, load_shift_set, set_name
from hmt.adapt.engine import EngineOptions
from hmt.adapt.guard import accuracy
from hmt.adapt.memory import as_chain, plan_checkpoints
from hmt.adapt.run import AdaptOptions, adapt_set, balanced_split, normalize, predict, training_peak_bytes
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


def memory_rows_in_process(model: torch.nn.Module, batch: torch.Tensor, fraction: float,
                           repeats: int) -> dict[str, object]:
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


def make_shift_set(source: Path, out: Path, severities: list[int], limit: int | None, workers: int) -> float:
    """The shift set at ``out`` from the CIFAR-10 source (as scripts/make_corruptions.py); seconds taken."""
    from hmt.adapt.corruptions import CORRUPTIONS, write_shift_set
    from hmt.data import load_dataset

    start = time.perf_counter()
    dataset = load_dataset("cifar10", source)
    x, y = dataset.test
    if limit is not None:
        keep = balanced_split(y, limit)[0]
        x, y = x[keep], y[keep]
    write_shift_set(out, x, y, corruptions=list(CORRUPTIONS), severities=severities, seed=0,
                    source={"dataset": dataset.info.source, "sha256": dataset.info.source_sha256, "split": "test",
                            "limit": str(limit)},
                    progress=lambda task, done, total, info=None: print(
                        f"{task} {done}/{total} {info or ''} ({time.perf_counter() - start:.0f} s)",
                        file=sys.stderr, flush=True),
                    workers=workers)
    return time.perf_counter() - start


BENCH = Driver(
    baseline="the source model on the same images (no adaptation)",
    needs="a supernet and a shift set or the CIFAR-10 source (--supernet, --data)",
    out_args=("--out", "{report}", "--out-dir", "{tmp}/out"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a shift set (scripts/make_corruptions.py)")
    parser.add_argument("--source", type=Path, default=None,
                        help="CIFAR-10 source: make the shift set at --data from it when --data does not exist")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes making the shift set")
    parser.add_argument("--arch", action="append", help="arch id, 'largest' or 'smallest' (repeatable)")
    parser.add_argument("--severity", type=int, action="append", help="severities to run (default 5)")
    parser.add_argument("--limit", type=int, default=None, help="class-balanced subset of each set")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--method", action="append", choices=["bn", "tent"])
    parser.add_argument("--budget-fraction", type=float, default=0.5,
                        help="memory: recomputation budget, share of plain autograd's saved bytes")
    parser.add_argument("--memory-repeats", type=int, default=1)
    parser.add_argument("--memory-batch-size", type=int, default=None, help="default: --batch-size")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (peak memory: max_memory_allocated)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default OUT_DIR/bench-adapt.json)")
    parser.add_argument("--out-dir", type=Path, default=None, help="bench-adapt.json and bench-adapt.md here")
    args = parser.parse_args(argv)
    if args.out is None and args.out_dir is None:
        parser.error("give --out or --out-dir")
    json_path = args.out or args.out_dir / "bench-adapt.json"
    md_path = (args.out_dir / "bench-adapt.md") if args.out_dir is not None else json_path.with_suffix(".md")
    if args.threads:
        torch.set_num_threads(args.threads)
    severities = args.severity or [5]
    started = time.perf_counter()
    report: dict[str, object] = {"machine": machine(), "command": " ".join(sys.argv), "variants": {},
                                 "timings_s": {}}
    if args.source is not None and not (args.data / "manifest.json").is_file():
        report["timings_s"]["make_corruptions"] = make_shift_set(  # type: ignore[index]
            args.source, args.data, sorted(set(severities)), args.limit, args.workers)
    loaded = load_supernet(args.supernet, device=args.device)
    info = loaded.dataset_info
    shift = load_shift_set(args.data)
    names = ["clean", *[set_name(c, s) for s in severities for c in
                        ("gaussian_noise", "shot_noise", "defocus_blur", "brightness", "contrast", "jpeg_compression")]]
    keep = np.arange(len(shift.labels)) if args.limit is None else balanced_split(shift.labels, args.limit)[0]
    labels = shift.labels[keep]
    report["images_per_set"] = len(keep)
    for arch_arg in args.arch or ["largest", "smallest"]:
        t0 = time.perf_counter()
        arch = {"largest": loaded.space.largest, "smallest": loaded.space.smallest}.get(arch_arg, lambda: None)()
        arch = arch or loaded.space.parse(arch_arg)
        model = loaded.materialize(arch)
        rows = {}
        for method in args.method or ["bn", "tent"]:
            options = AdaptOptions(method=method, batch_size=args.batch_size, tent=TentOptions(lr=args.lr))
            clean_x = normalize(shift.sets["clean"][keep], info["mean"], info["std"]).to(args.device)
            for name in names:
                x = normalize(shift.sets[name][keep], info["mean"], info["std"]).to(args.device)
                result, variant = adapt_set(model, name, x, labels, options)
                rows[f"{method}/{name}"] = result.to_json_dict()
                # The variant adapted to this set, on the clean images: what serving it after the
                # drift has passed would cost (why serve --adapt resets).
                rows[f"{method}/{name}"]["clean_accuracy_of_adapted"] = accuracy(predict(variant, clean_x), labels)
                del variant
                print(f"{arch.arch_id} {method:4s} {name:22s} {result.accuracy_before:.4f} -> "
                      f"{result.accuracy_after:.4f} (online {result.accuracy_online}) "
                      f"{result.adapt_ms_per_batch:.0f} ms/batch ({time.perf_counter() - started:.0f} s)",
                      file=sys.stderr, flush=True)
        report["timings_s"][f"{arch.arch_id}/accuracy"] = time.perf_counter() - t0  # type: ignore[index]
        memory: dict[str, object] = {}
        if not args.no_memory:
            from bench_adapt_memory import run_modes

            t0 = time.perf_counter()
            memory = run_modes(str(args.supernet), arch.arch_id, batch_size=args.memory_batch_size or args.batch_size,
                               device=args.device, modes=["plain", "int8", "recompute", "int8+recompute"],
                               repeats=args.memory_repeats, budget_fraction=args.budget_fraction,
                               int8_budget_fraction=0.15, threads=args.threads)
            report["timings_s"][f"{arch.arch_id}/memory"] = time.perf_counter() - t0  # type: ignore[index]
            medians = {k: {m: v for m, v in r.items() if m != "samples"}
                       for k, r in memory["modes"].items()}  # type: ignore[attr-defined]
            print(f"{arch.arch_id} memory {json.dumps(medians)}", file=sys.stderr, flush=True)
        report["variants"][arch.arch_id] = {"results": rows, "memory": memory}  # type: ignore[index]
        report["timings_s"]["total"] = time.perf_counter() - started  # type: ignore[index]
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        md_path.write_text(markdown(report) + "\n")
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
            forgot = [results[f"{m}/{n}"].get("clean_accuracy_of_adapted") for n in sets
                      if n.split("-s")[0] in NOISE_AND_BLUR and n.endswith("-s5")]
            if clean and forgot and None not in forgot:
                lines.append(f"- {m}: the variants adapted to noise+blur severity 5, on clean images: mean "
                             f"{100 * np.mean(forgot):.2f}% (source {100 * clean['accuracy_before']:.2f}%)")
            lines.append(f"- {m}: mean gain on noise+blur severity 5 {100 * np.mean(gains):+.2f} points; clean "
                         f"{100 * (clean['accuracy_after'] - clean['accuracy_before']):+.2f} points; "
                         f"median {ms:.0f} ms per batch" if gains and clean else f"- {m}")
        memory = body.get("memory") or {}
        if memory:
            from bench_adapt_memory import markdown as memory_markdown

            lines += ["", f"Peak memory of one TENT step, batch {memory['batch_size']} ({memory['device']}):", "",
                      memory_markdown([memory])]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
