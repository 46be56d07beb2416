"""Median (p50) and p95 decision time of hmt.serve.Optimizer for 10, 100 and 1000 candidates.

Two regimes: "steady" repeats conditions that change slowly (budgets fixed, battery in
whole percent, load varying), so decisions mostly hit the optimizer's cache; "cold"
clears the cache before every decision (worst case: every decision runs the numpy path).
Light: a few thousand decisions per size, one core.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver
from hmt.serve import Budgets, Optimizer, Variant


def table(n: int, rng: np.random.Generator) -> list[Variant]:
    latency_ms = rng.uniform(1.0, 50.0, n)
    accuracy = 0.5 + 0.4 * np.sqrt(latency_ms / 50.0) + rng.normal(0, 0.01, n)
    return [
        Variant(f"v{i}", float(accuracy[i]), float(latency_ms[i]), float(latency_ms[i] * 3.0), int(1e6 * (1 + i % 50)))
        for i in range(n)
    ]


def bench(n: int, repeats: int, cold: bool, rng: np.random.Generator) -> tuple[float, float]:
    opt = Optimizer(table(n, rng))
    loads = rng.uniform(0.0, 1.0, repeats)
    battery = rng.integers(20, 100, repeats).astype(float) if cold else np.full(repeats, 70.0)
    budgets = Budgets(latency_ms=25.0, memory_mb=30.0)
    times_s = np.empty(repeats)
    for i in range(repeats):
        if cold:
            opt._cache.clear()
        load, batt = float(loads[i]), float(battery[i])
        t0 = time.perf_counter()
        opt.decide(load, batt, None, budgets, 1.0, "v0")
        times_s[i] = time.perf_counter() - t0
    return float(np.median(times_s) * 1e3), float(np.percentile(times_s, 95) * 1e3)


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    return [{"claim": f"optimizer decision p50 / p95, {row['candidates']} candidates, {row['regime']}",
             "figure": f"{row['p50_ms'] * 1e3:.1f} / {row['p95_ms'] * 1e3:.1f} us"} for row in report["rows"]]


BENCH = Driver(baseline="the cold regime (cache cleared before every decision) beside the steady one",
               quick=["--repeats", "300", "--out", "{report}"], default=["--out", "{report}"], claims=_claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows: list[dict[str, Any]] = []
    print("candidates  regime  p50_ms    p95_ms")
    for n in (10, 100, 1000):
        for cold in (False, True):
            p50, p95 = bench(n, args.repeats, cold, rng)
            print(f"{n:10d}  {'cold' if cold else 'steady':6s}  {p50:.5f}  {p95:.5f}")
            rows.append({"candidates": n, "regime": "cold" if cold else "steady", "p50_ms": p50, "p95_ms": p95})
    if args.out is not None:
        args.out.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
