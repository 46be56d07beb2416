"""Peak memory of one TENT step: plain autograd vs the memory-saving engine, each mode in a fresh process.

    PYTHONPATH=$PWD python -m benchmarks.adapt.memory --supernet hmt/data/embedded/supernet-cifar-resnet56 \\
        --arch largest --arch smallest --batch-size 128 --repeats 2 --out runs/adapt-memory.json

Modes (``hmt.adapt.engine.EngineOptions``): ``plain`` (autograd, one optimizer step after
backward), ``int8`` (8-bit saved activations + each BN parameter updated inside backward),
``recompute`` (fp32, recomputation planned under a budget of ``--budget-fraction`` of what
plain autograd saves on the batch), ``int8+recompute`` (8-bit + recomputation under
``--int8-budget-fraction`` of it, below what 8-bit alone keeps), ``int8-heap`` (``int8`` with
glibc's mmap threshold left alone: faster on a CPU, but freed blocks stay resident). Each (arch, mode) runs in
its own subprocess, repeats interleaved, and reports three peaks of one TENT step above what was held before it:

- ``saved_peak_bytes``: bytes autograd holds for backward (pack hooks, ``SavedTensorMeter``);
- ``allocator_peak_bytes``: the torch allocator's peak (CUDA ``max_memory_allocated``; on a
  CPU the allocation events of torch's profiler), which includes the backward's transients;
- ``rss_peak_bytes`` (CPU): the process's resident peak (``VmHWM`` reset through
  ``/proc/self/clear_refs`` just before the step) above its resident size then; the first
  step of a fresh process (planning included), so nothing freed by an earlier step is
  reused; ``rss_second_step_peak_bytes`` the same over the next step (JSON only: plain
  autograd's second step reuses the heap its first left resident, so it reads near 0).

``step_s`` is the median time of three steps neither metered nor profiled.

The engine modes pin glibc's mmap threshold (``EngineOptions.return_freed_memory``); plain
autograd runs with the C library's defaults, as a user's training loop would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

MODES = ("plain", "int8", "recompute", "int8+recompute", "int8-heap")


def _proc_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from hmt.adapt.engine import EngineOptions
    from hmt.adapt.memory import SavedTensorMeter, as_chain, peak_bytes, plan_checkpoints
    from hmt.adapt.tent import TentAdapter, TentOptions, configure_for_tent
    from hmt.supernet import load_supernet

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_supernet(args.supernet, device=args.device)
    arch = {"largest": loaded.space.largest, "smallest": loaded.space.smallest}.get(args.arch, lambda: None)() \
        or loaded.space.parse(args.arch)
    model = loaded.materialize(arch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, *loaded.model_info["input_shape"], generator=g).to(args.device)
    budget = None
    if "recompute" in args.mode:
        # The budget is a share of what plain autograd saves (the planner's fp32 estimate on this batch).
        probe = __import__("copy").deepcopy(model)
        configure_for_tent(probe)
        plan = plan_checkpoints(as_chain(probe), x, None, compress=False,
                                exclude=[*probe.parameters(), *probe.buffers()])
        fraction = args.budget_fraction if args.mode == "recompute" else args.int8_budget_fraction
        budget = int(plan.estimated_bytes * fraction)
        del probe
    engine = {"plain": EngineOptions(compress=False, update_in_backward=False),
              "int8": EngineOptions(compress=True, update_in_backward=True),
              "int8+recompute": EngineOptions(compress=True, budget_bytes=budget, update_in_backward=True),
              "recompute": EngineOptions(compress=False, budget_bytes=budget, update_in_backward=True),
              "int8-heap": EngineOptions(compress=True, update_in_backward=True, return_freed_memory=False)}[args.mode]
    adapter = TentAdapter(model, TentOptions(engine=engine))
    cuda = x.device.type == "cuda"
    out: dict[str, Any] = {"arch": arch.arch_id, "mode": args.mode, "batch_size": args.batch_size,
                           "budget_bytes": budget, "device": str(x.device)}
    # 1. the first step of this process: resident peak (CPU) or allocator peak (CUDA).
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")
        rss0 = _proc_kib("VmRSS")
    start = time.perf_counter()
    adapter.step(x)
    if cuda:
        torch.cuda.synchronize()
        out["first_step_allocator_peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
    else:
        out["rss_peak_bytes"] = (_proc_kib("VmHWM") - rss0) * 1024
    out["first_step_s"] = time.perf_counter() - start
    # 2. what autograd keeps for backward (and, on a CPU, the resident peak of a planned step).
    meter = SavedTensorMeter()
    adapter.engine.meter = meter
    if not cuda:
        Path("/proc/self/clear_refs").write_text("5")
        rss0 = _proc_kib("VmRSS")
    adapter.step(x)
    if not cuda:
        out["rss_second_step_peak_bytes"] = (_proc_kib("VmHWM") - rss0) * 1024
    out["mmap_pinned"] = adapter.engine.mmap_pinned
    out["saved_peak_bytes"] = meter.peak_bytes
    out["saved_live_after_bytes"] = meter.live_bytes
    adapter.engine.meter = None
    # 3. the allocator's peak of a step (plan made, caches warm).
    out["allocator_peak_bytes"] = peak_bytes(lambda: adapter.step(x), device=x.device)
    # 4. the time of a step, neither metered nor profiled (median of 3).
    times = []
    for _ in range(3):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        adapter.step(x)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    out["step_s"] = sorted(times)[1]
    out["plan"] = adapter.engine.plan.to_json_dict() if adapter.engine.plan is not None else None
    adapter.close()
    return out


def run_modes(supernet: str, arch: str, *, batch_size: int, device: str, modes: list[str], repeats: int,
              budget_fraction: float, int8_budget_fraction: float, threads: int | None) -> dict[str, Any]:
    """Every mode ``repeats`` times, interleaved, each in a fresh process; medians and ratios vs plain."""
    import numpy as np

    samples: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for mode in modes:
            if mode in errors:
                continue
            command = [sys.executable, __file__, "--child", "--supernet", supernet, "--arch", arch, "--mode", mode,
                       "--batch-size", str(batch_size), "--device", device, "--budget-fraction", str(budget_fraction),
                       "--int8-budget-fraction", str(int8_budget_fraction)]
            if threads:
                command += ["--threads", str(threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=False,
                                  env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())})
            if done.returncode != 0:
                errors[mode] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"rc {done.returncode}"
                continue
            samples[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = ("saved_peak_bytes", "allocator_peak_bytes", "rss_peak_bytes", "rss_second_step_peak_bytes",
            "first_step_allocator_peak_bytes", "step_s")
    rows: dict[str, Any] = {}
    for mode, runs in samples.items():
        if not runs:
            continue
        rows[mode] = {k: float(np.median([r[k] for r in runs])) for k in keys if k in runs[0]}
        rows[mode]["samples"] = runs
    if "plain" in rows:
        for row in rows.values():
            for k in keys[:-1]:
                if k in row and row.get(k) is not None and rows["plain"].get(k):
                    row[k.replace("_bytes", "_vs_plain")] = row[k] / rows["plain"][k]
    arch_id = next((r[0]["arch"] for r in samples.values() if r), arch)
    return {"arch": arch_id, "batch_size": batch_size, "device": device, "modes": rows, "errors": errors}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| variant | mode | saved MiB (x plain) | allocator peak MiB (x plain) | RSS peak MiB, 1st step "
             "(x plain) | step s (x plain) |", "| --- | --- | --- | --- | --- | --- |"]

    def cell(row: dict[str, Any], key: str) -> str:
        if key not in row:
            return "-"
        ratio = row.get(key.replace("_bytes", "_vs_plain"))
        return f"{row[key] / 2**20:.1f}" + (f" ({ratio:.2f}x)" if ratio is not None else "")

    for result in results:
        for mode, row in result["modes"].items():
            alloc = "allocator_peak_bytes"
            lines.append(f"| {result['arch'].split('.', 1)[-1][:40]} | {mode} | {cell(row, 'saved_peak_bytes')} | "
                         f"{cell(row, alloc)} | {cell(row, 'rss_peak_bytes')} | {row['step_s']:.3f} "
                         f"({row['step_s'] / result['modes'].get('plain', row)['step_s']:.2f}x) |")
        for mode, error in result["errors"].items():
            lines.append(f"| {result['arch'].split('.', 1)[-1][:40]} | {mode} | failed: {error[:80]} | | | |")
    return "\n".join(lines)


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    """Saved-tensor peak of each mode against plain autograd's, per arch."""
    claims = []
    for row in report["results"]:
        modes = row.get("modes", {})
        plain = modes.get("plain", {}).get("saved_peak_bytes")
        for mode, figures in modes.items():
            if mode == "plain" or not plain or "saved_peak_bytes" not in figures:
                continue
            claims.append({"claim": f"TENT step saved-tensor peak, {mode} against plain autograd "
                                    f"({row['arch'].rsplit('.', 1)[-1]}, batch {row['batch_size']}, {row['device']})",
                           "figure": f"{figures['saved_peak_bytes'] / 2**20:.1f} MiB against {plain / 2**20:.1f} MiB "
                                     f"({plain / figures['saved_peak_bytes']:.2f}x less)"})
    return claims


BENCH = Driver(
    baseline="plain autograd (one optimizer step after backward), each mode in a fresh process, repeats "
             "interleaved",
    quick=["--supernet", "{supernet}", "--arch", "smallest", "--batch-size", "8", "--repeats", "1",
             "--mode", "plain", "--mode", "int8", "--out", "{report}"],
    needs="",
    claims=_claims,
    timeout_s=600,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", required=True)
    parser.add_argument("--arch", action="append", help="arch id, largest or smallest (repeatable)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget-fraction", type=float, default=0.5,
                        help="recompute: activation budget as a share of plain autograd's saved bytes")
    parser.add_argument("--int8-budget-fraction", type=float, default=0.15,
                        help="int8+recompute: the same share (below int8 alone, ~0.25)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.arch = args.arch[0]
        args.mode = args.mode[0]
        print(json.dumps(child(args)))
        return 0
    results = [run_modes(args.supernet, arch, batch_size=args.batch_size, device=args.device,
                         modes=args.mode or list(MODES), repeats=args.repeats, budget_fraction=args.budget_fraction,
                         int8_budget_fraction=args.int8_budget_fraction, threads=args.threads)
               for arch in args.arch or ["largest", "smallest"]]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=2) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
