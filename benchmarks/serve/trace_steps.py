"""Per-window trace of a serve scenario run around each step (issue 14's recovery target).

Reads the per-request and per-tick CSVs that ``benchmarks/serve/scenario.py`` copies for its first
adaptive run (``requests_<engine>_adaptive.csv``, ``timeline_<engine>_adaptive.csv``) and prints,
for each step, the requests in ``--bin-s`` bins (sent, missed, worst server latency, worst queue
wait = latency - compute, the variants that answered) and every tick of the loop in the same
span (load index now / forecast, active / proposed variant, switch reason, the active variant's
estimate and its source). It says *why* the first 0.5 s window after a step was clean or not.

    python -m benchmarks.serve.trace_steps runs/trace_base --engine tvm --phase-s 4
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def _float(text: str) -> float | None:
    return float(text) if text not in ("", "None") else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="bench_serve.py's --out directory")
    parser.add_argument("--engine", default="tvm")
    parser.add_argument("--mode", default="adaptive")
    parser.add_argument("--phase-s", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=6, help="steps after the first phase")
    parser.add_argument("--span-s", type=float, default=1.0, help="how long after each step to show")
    parser.add_argument("--bin-s", type=float, default=0.1)
    args = parser.parse_args()
    with open(args.run_dir / f"requests_{args.engine}_{args.mode}.csv") as handle:
        requests = list(csv.DictReader(handle))
    with open(args.run_dir / f"timeline_{args.engine}_{args.mode}.csv") as handle:
        ticks = list(csv.DictReader(handle))
    for k in range(1, args.steps + 1):
        step = k * args.phase_s
        print(f"== step at {step:g} s")
        for b in range(round(args.span_s / args.bin_s)):
            lo, hi = step + b * args.bin_s, step + (b + 1) * args.bin_s
            rows = [r for r in requests if lo <= float(r["time_s"]) < hi]
            missed = [r for r in rows if r["status"] != "200" or (
                _float(r["latency_ms"]) or 0.0) > (_float(r["latency_budget_ms"]) or float("inf"))]
            lat = [_float(r["latency_ms"]) or 0.0 for r in rows]
            queue = [(_float(r["latency_ms"]) or 0.0) - (_float(r["compute_ms"]) or 0.0) for r in rows]
            variants = sorted({r["variant"][-6:] for r in rows if r["variant"]})
            print(f"  +{lo - step:4.1f}s  sent {len(rows):3d}  missed {len(missed):3d}  "
                  f"max latency {max(lat, default=0):7.1f} ms  max queue {max(queue, default=0):7.1f} ms  {variants}")
        for t in ticks:
            ts = float(t["time_s"])
            if step - 0.3 <= ts < step + args.span_s:
                print(f"    tick {ts - step:+5.2f}s {t['trigger']:9s} I {float(t['load_index']):.2f} "
                      f"fc {float(t['load_forecast']):.2f} active {t['active'][-6:]} proposed {t['proposed'][-6:]} "
                      f"{t['switch_reason']:38s} est {float(t['predicted_latency_ms']):6.1f} ms "
                      f"({t['estimate_source']}) budget {t['latency_budget_ms']} overhead "
                      f"{float(t['overhead_ms']):.1f}")


if __name__ == "__main__":
    main()
