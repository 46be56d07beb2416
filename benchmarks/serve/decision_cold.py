"""The loop's decision (estimates -> eq. 3 -> hysteresis) hot, after a sleep, and with the core kept busy.

Builds a controller on serve's tiny test bundle (4 variants, ONNX Runtime), feeds it
requests so the estimates are measured, then times ``DecisionPath.choose`` +
``Switcher.offer`` (what ``decision_us`` covers in the loop) as thread CPU time:

- hot: back to back;
- after sleep: each call after the control thread slept ``--gap-s`` (the loop's situation);
- busy between: each call after ``--gap-s`` of other Python work instead of sleeping.

    python -m benchmarks.serve decision_cold          # result: benchmarks/serve/results/decision_cold.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "serve"))

from serve_bundles import VariantDef, make_bundle

from benchmarks.harness import Driver
from hmt.bundle import load_bundle
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.deciding.monitor import ResourceSample


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    p50 = report["decision_cpu_us_p50"]
    gap_ms = report["gap_s"] * 1e3
    return [{"claim": "the loop's decision (choice + switcher), CPU time p50, hot / after a sleep / after other work",
             "figure": f"{p50['hot']:.1f} / {p50['after_sleep']:.1f} / {p50['after_busy']:.1f} us "
                       f"(gap {gap_ms:.0f} ms)"}]


BENCH = Driver(baseline="the same decision called back to back (hot), in the same process",
               quick=["--calls", "20", "--hot-calls", "200", "--out", "{report}"],
               default=["--out", "{report}"], claims=_claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gap-s", type=float, default=0.05)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--hot-calls", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None, help="write the medians here (JSON)")
    args = parser.parse_args()
    variants = [VariantDef(f"v{i}", 0.8 + 0.01 * i, 1.0 + i, 1.0 + i, energy=10.0 + i) for i in range(4)]
    bundle = load_bundle(make_bundle(Path(tempfile.mkdtemp()) / "b", variants))
    sample = ResourceSample(time.monotonic(), 0.3, 8, 8, battery_percent=70.0, battery_plugged=False)
    c = Controller(bundle, ServeSettings.from_mapping({"budgets": {"latency_ms": 3.0}}), sampler=lambda: sample,
                   warmup_runs=1)
    c.start(background=False)
    x = np.zeros((1, 4), dtype=np.float32)
    for _ in range(50):
        c.predict(x)
    budgets = c.budgets
    limit_ms, _ = c._latency_limit_ms(budgets)
    mu = c.decision.mu(sample)

    def one() -> float:
        # What decision_us covers in the loop: the (cached) choice over the feasible set + the switcher.
        mask = c._estimate(0.3, 0.3, limit_ms, budgets)
        t0 = time.thread_time_ns()
        choice = c.decision.choose(mask, mu, c.switcher.active_arch_id)
        c.switcher.offer(choice)
        return (time.thread_time_ns() - t0) / 1e3

    def busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sum(range(1000))

    hot = [one() for _ in range(args.hot_calls)]
    slept, kept_busy = [], []
    for _ in range(args.calls):
        time.sleep(args.gap_s)
        slept.append(one())
        busy(args.gap_s)
        kept_busy.append(one())
    print(f"decision CPU us p50: hot {np.median(hot):.1f}, after a {args.gap_s * 1e3:.0f} ms sleep "
          f"{np.median(slept):.1f}, after {args.gap_s * 1e3:.0f} ms of other Python work {np.median(kept_busy):.1f}")
    if args.out is not None:
        report = {"gap_s": args.gap_s, "calls": args.calls, "hot_calls": args.hot_calls,
                  "decision_cpu_us_p50": {"hot": float(np.median(hot)), "after_sleep": float(np.median(slept)),
                                          "after_busy": float(np.median(kept_busy))}}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
