"""Benchmark convert + fuse against torch eager, ONNX Runtime and TVM, against the GEMM floor.

For each model and batch size: ``hmt convert`` (torch factory), ``hmt fuse`` (which picks
an engine per variant), then one alternating timing loop in this process over
torch eager, ORT with default options on the converted graph, TVM untuned, TVM tuned
(with --tune-trials) and the fuse output (rebuilt from the fused artifact the way a
runtime loads it). The GEMM peak is measured in the same run (torch matmul, fp32, on the
physical cores), giving the physical floor ``2 * MACs / peak`` for every model.

Other jobs may share the machine: engines are alternated inside one loop, so load hits
all of them alike; the ratios are the robust numbers, absolute times are not.

Timing mode (``--burst``, default 8, the same as ``hmt fuse``): each visit of an engine
is a pause then ``burst`` back-to-back calls, calls 2..burst timed (serve under load);
the first call after the pause is reported as ``cold_median_ms``. ``--burst 1`` times
every call after a pause (the rate of a server idling between requests; thread pools
fall asleep in the pause, which costs ORT several times its back-to-back time on a
16-core host).

Usage (CPU, ~15 min without tuning):

    python -m benchmarks.convert_fuse.engines --out benchmarks/convert_fuse/results_cpu.json

GPU machine:

    python -m benchmarks.convert_fuse.engines --device cuda --out benchmarks/convert_fuse/results_cuda.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# TVM's worker threads spin after each call long enough to slow the next engine ~10-100x
# on 2 cores; without spinning TVM itself measured no slower here. Set before TVM loads.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

MODELS = {
    "resnet18": "benchmarks/convert_fuse/_models.py:resnet18_cifar",
    "mobilenetv2": "benchmarks/convert_fuse/_models.py:mobilenetv2_cifar",
    "supernet-largest": "benchmarks/convert_fuse/_supernet_models.py:largest",
    "supernet-smallest": "benchmarks/convert_fuse/_supernet_models.py:smallest",
}


def gemm_peak_gflops(device: str, threads: int, *, n: int = 1024, seconds: float = 2.0) -> float:
    """Best fp32 GEMM throughput of torch.matmul (TF32 off on CUDA)."""
    import torch

    torch.set_num_threads(threads)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        n = 4096
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / 4)
    return 2 * n**3 / best / 1e9


def count_macs(onnx_paths: list[Path]) -> int:
    """Multiply-accumulates of Conv, ConvTranspose, Gemm and MatMul nodes (shapes inferred)."""
    import numpy as np
    import onnx

    total = 0
    for path in onnx_paths:
        model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
        shapes = {}
        for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
            shapes[value.name] = [d.dim_value for d in value.type.tensor_type.shape.dim]
        inits = {i.name: list(i.dims) for i in model.graph.initializer}
        for node in model.graph.node:
            out = shapes.get(node.output[0])
            if not out:
                continue
            if node.op_type == "Conv":
                w = inits.get(node.input[1]) or shapes.get(node.input[1]) or [0]
                total += int(np.prod(out)) * int(np.prod(w[1:]))
            elif node.op_type in ("Gemm", "MatMul"):
                a = shapes.get(node.input[0]) or inits.get(node.input[0]) or [0, 0]
                trans_a = any(at.name == "transA" and at.i for at in node.attribute)
                k = a[-2] if trans_a else a[-1]
                total += int(np.prod(out)) * int(k)
    return total


def bench_one(name: str, factory: str, batch: int, args: argparse.Namespace, work: Path,
              peak_gflops: float) -> dict[str, Any]:
    import numpy as np
    import torch

    from hmt.convert import ConvertOptions, TorchSource, convert_model
    from hmt.convert.sources import load_factory_module
    from hmt.fuse import FuseOptions, fuse_model
    from hmt.fuse.engines.timing import measure_alternating
    from hmt.fuse.runtime import load_fused_runner

    shape = (batch, 3, 32, 32)
    converted, fused = work / f"{name}-b{batch}-converted", work / f"{name}-b{batch}-fused"
    t0 = time.perf_counter()
    convert_model(TorchSource(str(ROOT / factory), (shape,)), converted, options=ConvertOptions(seed=0))
    convert_s = time.perf_counter() - t0
    engines = ("ort",) if args.no_tvm else ("ort", "tvm")
    t0 = time.perf_counter()
    result = fuse_model(converted, fused, options=FuseOptions(
        engines=engines, device=args.device, tune_trials=args.tune_trials,
        tuning_dir=Path(args.tuning_dir) if args.tuning_dir else None, repeats=args.fuse_repeats,
        timing_burst=args.burst))
    fuse_s = time.perf_counter() - t0
    entry = result.report["variants"][0]
    macs = count_macs([converted / f for f in entry["timed_path"]])
    floor_ms = 2 * macs / (peak_gflops * 1e9) * 1e3

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    net = load_factory_module(str(ROOT / factory)).to(args.device)
    xt = torch.from_numpy(x).to(args.device)

    def run_torch() -> Any:
        with torch.no_grad():
            out = net(xt)
        if args.device == "cuda":
            torch.cuda.synchronize()
        return out

    feeds = {"input": x}
    runners = {"torch-eager": run_torch,
               "ort-default": load_fused_runner(fused, "model", feeds, candidate="ort-default(converted)")}
    for label in ("tvm", "tvm-tuned"):
        if label in entry["candidates"]:
            runners[f"{label}"] = load_fused_runner(fused, "model", feeds, candidate=label)
    runners["hmt-fuse"] = load_fused_runner(fused, "model", feeds)
    load_before = os.getloadavg()[0]
    timings = measure_alternating(runners, warmup=args.warmup, repeats=args.repeats, burst=args.burst)
    load_after = os.getloadavg()[0]
    med = {k: v.median_ms for k, v in timings.items()}
    low = {k: v.min_ms for k, v in timings.items()}
    plan = result.variants[0]
    row = {
        "model": name, "batch": batch, "macs": macs, "floor_ms": round(floor_ms, 3),
        "timings": {k: v.to_json() for k, v in timings.items()},
        "fuse_choice": entry["choice"]["candidate"],
        "fuse_internal_timings_ms": {k: c["timing"]["median_ms"] for k, c in entry["candidates"].items()
                                     if c.get("timing")},
        "load_average_1min": [round(load_before, 2), round(load_after, 2)],
        "fuse_vs_ort_default": round(med["ort-default"] / med["hmt-fuse"], 3),
        "fuse_vs_ort_default_cold": (round(timings["ort-default"].cold_median_ms / timings["hmt-fuse"].cold_median_ms,
                                           3) if timings["hmt-fuse"].cold_median_ms else None),
        "fuse_vs_ort_default_min": round(low["ort-default"] / low["hmt-fuse"], 3),
        "fuse_vs_torch_min": round(low["torch-eager"] / low["hmt-fuse"], 3),
        "fuse_share_of_peak_min": round(floor_ms / low["hmt-fuse"], 3),
        "fuse_vs_torch": round(med["torch-eager"] / med["hmt-fuse"], 3),
        "fuse_share_of_peak": round(floor_ms / med["hmt-fuse"], 3),
        "ort_share_of_peak": round(floor_ms / med["ort-default"], 3),
        "fusions_fired": plan.fired,
        "memory_plan": {"planned_peak_bytes": plan.planned_peak_bytes, "naive_bytes": plan.naive_bytes,
                        "lower_bound_bytes": plan.lower_bound_bytes,
                        "planned_over_naive": round(plan.planned_peak_bytes / plan.naive_bytes, 3)},
        "tvm_compile_s": entry["candidates"].get("tvm", {}).get("compile_s"),
        "tuning": entry["candidates"].get("tvm-tuned", {}).get("tuning"),
        "convert_s": round(convert_s, 2), "fuse_s": round(fuse_s, 2),
        "max_abs_error_vs_torch": json.loads((converted / "manifest.json").read_text())["metrics"]["max_abs_error"],
    }
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | batch | MMACs | floor ms | torch ms | ORT default ms | TVM untuned ms | TVM tuned ms | hmt fuse ms "
        "(choice) | fuse/ORT | fuse/torch | fuse % of peak | fuse/ORT (min) | fuse/ORT (cold) | plan/naive | load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        t = {k: v["median_ms"] for k, v in r["timings"].items()}

        def fmt(key: str, t: dict[str, float] = t) -> str:
            return f"{t[key]:.2f}" if key in t else "-"

        cold = f"{r['fuse_vs_ort_default_cold']:.2f}x" if r.get("fuse_vs_ort_default_cold") else "-"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['macs'] / 1e6:.0f} | {r['floor_ms']:.2f} | {fmt('torch-eager')} | "
            f"{fmt('ort-default')} | {fmt('tvm')} | {fmt('tvm-tuned')} | {fmt('hmt-fuse')} ({r['fuse_choice']}) | "
            f"{r['fuse_vs_ort_default']:.2f}x | {r['fuse_vs_torch']:.2f}x | {100 * r['fuse_share_of_peak']:.0f}% | "
            f"{r['fuse_vs_ort_default_min']:.2f}x | {cold} | {r['memory_plan']['planned_over_naive']:.2f} | "
            f"{r['load_average_1min'][0]:.1f} |"
        )
    return "\n".join(lines)


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    """fuse's output against ORT with default options, per model and batch (same loop)."""
    return [{"claim": f"fuse against ORT default options, {row['model']} batch {row['batch']} ({report.get('device')})",
             "figure": f"{row['fuse_vs_ort_default']:.2f}x (fuse chose {row.get('fuse_choice')})"}
            for row in report["rows"] if row.get("fuse_vs_ort_default") is not None]


BENCH = Driver(
    baseline="torch eager, ONNX Runtime default options and TVM untuned on the same model, in one "
             "alternating loop; the GEMM floor measured in the same run",
    quick=["--models", "supernet-smallest", "--batches", "1", "--repeats", "5", "--warmup", "1",
             "--fuse-repeats", "3", "--no-tvm", "--out", "{report}"],
    default=["--out", "{report}"],
    claims=_claims,
    timeout_s=7200,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--fuse-repeats", type=int, default=20)
    parser.add_argument("--burst", type=int, default=8,
                        help="back-to-back calls per visit of an engine, calls 2..N timed (1: pause before each)")
    parser.add_argument("--tune-trials", type=int, default=0)
    parser.add_argument("--tuning-dir", default=None)
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--out", default=None, help="JSON results file")
    parser.add_argument("--work-dir", default=None, help="keep artifacts here (default: a temp dir)")
    args = parser.parse_args()

    from hmt.fuse.engines.timing import timing_mode
    from hmt.graph.model import cpu_count_physical

    threads = cpu_count_physical()
    peak = gemm_peak_gflops(args.device, threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hmt-bench-") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            for batch in args.batches:
                print(f"== {name} batch {batch}", file=sys.stderr, flush=True)
                rows.append(bench_one(name, MODELS[name], batch, args, work, peak))
                print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        peak_after = gemm_peak_gflops(args.device, threads)
    from tvm.target import codegen

    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": args.device,
        "host": {"cpu": codegen.llvm_get_system_cpu(), "physical_cores": threads, "logical_cores": os.cpu_count(),
                 "platform": platform.platform()},
        "gemm_peak_gflops": {"before": round(peak, 1), "after": round(peak_after, 1)},
        "tvm_thread_pool_spin_count": os.environ.get("TVM_THREAD_POOL_SPIN_COUNT"),
        "timing": timing_mode(args.burst, 0.005),
        "supernet": os.environ.get("HMT_BENCH_SUPERNET")
        or f"random weights, {os.environ.get('HMT_BENCH_BACKBONE', 'resnet18')}",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"GEMM peak {peak:.1f} GFLOP/s before, {peak_after:.1f} after ({threads} threads)")
    print(markdown(rows))


if __name__ == "__main__":
    main()
