"""Markdown rows from bench_serve.py results (session 5): per mode, misses per phase (steps at
4/8/12/16/20 s: 1 core busy, 2 cores busy, idle, memory cut, cut + 1 core), the whole run, top-1,
accuracy against the same run's unloaded loop, the first clean window after each step (max over
the steps, and after the three load steps 4 / 8 / 20 s), switches, decision p50, client-side
misses and latency.

    python3 benchmarks/runtime/serve-s5/summarize.py benchmarks/runtime/serve-s5/tvm2_{new,base}.json
"""

from __future__ import annotations

import json
import sys

PHASES = (4.0, 8.0, 12.0, 16.0, 20.0)
LOAD_STEPS = (4.0, 8.0, 20.0)


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def main(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    for engine, body in data["engines"].items():
        scenario = body["scenario"]
        print(f"\n{path} {engine}: budget {scenario['budget_ms']:.2f} ms")
        print("| mode | 1 core | 2 cores | idle | mem cut | cut+1 core | whole run | top-1 | vs unloaded |"
              " first clean max (4 / 8 / 20 s) | switches | decision p50 | client misses | client p50 / p95 |")
        print("|---" * 14 + "|")
        runs = scenario["runs"]
        for mode, reps in runs.items():
            for k, r in enumerate(reps):
                steps = {round(s["time_s"]): s for s in r["steps"]}
                cells = []
                for t in PHASES:
                    s = steps.get(round(t))
                    cells.append(f"{100 * s['misses'] / s['judged']:.1f}%" if s and s["judged"] else "-")
                unloaded = runs.get("adaptive_unloaded", [None] * (k + 1))[k]
                delta = (100 * (r["accuracy"] - unloaded["accuracy"])) if unloaded else float("nan")
                clean = " / ".join(_s(steps[round(t)]["first_clean_window_s"]) for t in LOAD_STEPS
                                   if round(t) in steps)
                client = r["client_ms"]
                print(f"| {mode} | " + " | ".join(cells)
                      + f" | {100 * r['deadline_miss_share']:.2f}% | {100 * r['accuracy']:.1f}% | {delta:+.1f}"
                      + f" | {_s(r.get('first_clean_window_s_max'))} ({clean}) s | {r['switches']}"
                      + f" | {r['decision_us']['p50']:.1f} us | {100 * r['client_over_budget_share']:.1f}%"
                      + f" | {client['p50']:.1f} / {client['p95']:.1f} ms |")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
