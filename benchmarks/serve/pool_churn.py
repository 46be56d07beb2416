"""Memory under pool churn (issue 17 item 9): N load/evict cycles of a bundle's variants, RSS sampled.

Each cycle loads one variant into serve's :class:`~hmt.serve.running.pool.VariantPool` (verified
graphs, real ONNX Runtime or TVM sessions, warm-up runs) and evicts it again, the way a
memory cut and its release do. RSS is read every ``--every`` cycles; the report gives the
growth per load, after the first ``--every`` cycles (runtime imports), over the first and
the second half (a leak grows in both; allocator warm-up only in the first).

    PYTHONPATH=$PWD python -m benchmarks.serve.pool_churn --bundle runs/demo/bundle-x86-64 --cycles 1000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import psutil

from benchmarks.harness import Driver
from hmt.bundle import load_bundle
from hmt.serve.running.pool import VariantPool


def churn(bundle_path: Path, cycles: int, every: int, engine: str, warmup_runs: int) -> dict[str, object]:
    bundle = load_bundle(bundle_path)
    pool = VariantPool(bundle, engine=engine, threads=1, warmup_runs=warmup_runs)
    ids = [v.arch_id for v in bundle.spec.variants]
    process = psutil.Process()
    rss: list[tuple[int, int]] = []
    start = time.perf_counter()
    for cycle in range(cycles + 1):
        if cycle % every == 0:
            gc.collect()
            rss.append((cycle, process.memory_info().rss))
        if cycle == cycles:
            break
        pool.load(ids[cycle % len(ids)])
        pool.trim(0, keep=())
    elapsed_s = time.perf_counter() - start
    xs = np.array([c for c, _ in rss], dtype=float)
    ys = np.array([r for _, r in rss], dtype=float)
    # The first sample is before any load (runtime imports and arenas come with the first
    # loads): growth is measured from the second sample on.
    xs, ys = xs[1:], ys[1:]
    half = len(xs) // 2

    def slope(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.polyfit(a, b, 1)[0]) if len(a) >= 2 else float("nan")

    return {
        "bundle": str(bundle_path), "engine": engine, "cycles": cycles, "variants": ids,
        "loads": pool.load_count, "evictions": pool.evictions, "seconds": round(elapsed_s, 1),
        "rss_mb_before_loads": round(rss[0][1] / 1e6, 2),
        "rss_mb_first": round(ys[0] / 1e6, 2), "rss_mb_last": round(ys[-1] / 1e6, 2),
        "rss_mb_max": round(float(ys.max()) / 1e6, 2),
        "growth_bytes_per_load_first_half": round(slope(xs[: half + 1], ys[: half + 1]), 1),
        "growth_bytes_per_load_second_half": round(slope(xs[half:], ys[half:]), 1),
        "rss_samples": [(c, r) for c, r in rss],
        "machine": {"logical_cpus": os.cpu_count(), "platform": platform.platform(),
                    "shared": "2 cores shared with other agents"},
    }


BENCH = Driver(
    baseline="the RSS after the first --every cycles (runtime imports), growth measured against it",
    needs="a deploy bundle (--bundle)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--engine", default="onnxruntime", choices=("onnxruntime", "tvm", "auto"))
    parser.add_argument("--warmup-runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args()
    report = churn(args.bundle, args.cycles, args.every, args.engine, args.warmup_runs)
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {k: v for k, v in report.items() if k != "rss_samples"}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
