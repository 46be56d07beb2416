"""Decision time inside the running control loop, this tree against a baseline git revision, one run.

Each measurement is a child process that builds serve's tiny test bundle (4 variants,
real ONNX Runtime sessions), starts a real :class:`~hmt.serve.controller.Controller`
with its background control thread, and sends requests from two client threads for
``--seconds`` while a synthetic sampler moves the outside load between phases (so
decisions see the budget bind, the load index move and switches happen). It then reads
the loop's own per-tick records: ``decision_us`` (wall time of the decision the loop
timed itself) and ``decision_cpu_us`` (thread CPU time of the same span).

The baseline runs the same child from ``git archive <rev>`` (the code before this
branch), alternating with this tree, ``--reps`` times each, so both see the same
machine. Prints load average before and after.

    PYTHONPATH=$PWD python -m benchmarks.serve.decision_loop --baseline 1e54622 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, tempfile, threading, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(sys.argv[1]) / "tests" / "serve"))
from serve_bundles import VariantDef, make_bundle
from hmt.bundle import load_bundle
from hmt.serve.controller import Controller
from hmt.serve.deciding.monitor import ResourceSample
from hmt.runtime.settings import ServeSettings

seconds, period_s, rate_hz = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
variants = [VariantDef(f"v{i}", 0.80 + 0.03 * i, 0.05 * (i + 1), 1.0 + i, energy=10.0 + i, work=8 * i)
            for i in range(4)]
bundle = load_bundle(make_bundle(Path(tempfile.mkdtemp()) / "b", variants))
t0 = time.monotonic()
phases = [0.0, 0.5, 1.0, 0.2]  # outside CPU load, 1 s each, cycling

def sampler():
    phase = phases[int(time.monotonic() - t0) % len(phases)]
    return ResourceSample(time.monotonic(), phase, 8, 8, battery_percent=70.0, battery_plugged=False)

settings = ServeSettings.from_mapping({"budgets": {"latency_ms": 0.4}, "monitor_period_s": period_s,
                                       "switch": {"min_dwell_s": 0.3}})
c = Controller(bundle, settings, sampler=sampler, warmup_runs=1)
c.start(background=True)
x = np.zeros((1, 4), dtype=np.float32)
stop = time.monotonic() + seconds

def client(seed):
    rng = np.random.default_rng(seed)
    while time.monotonic() < stop:
        c.predict(x, queued_ms=float(rng.uniform(0.0, 0.05)))
        time.sleep(float(rng.exponential(2.0 / rate_hz)))

threads = [threading.Thread(target=client, args=(s,)) for s in range(2)]
for t in threads: t.start()
for t in threads: t.join()
c.stop()
ticks = list(c.ticks)
wall = np.array([t.decision_us for t in ticks])
cpu = np.array([t.decision_cpu_us for t in ticks])
est = np.array([getattr(t, "estimate_us", 0.0) for t in ticks])
print(json.dumps({"ticks": len(ticks), "switches": c.switcher.switch_count, "requests": c.stats.requests,
                  "decision_us_p50": float(np.median(wall)), "decision_us_p95": float(np.percentile(wall, 95)),
                  "decision_cpu_us_p50": float(np.median(cpu)), "estimate_us_p50": float(np.median(est)),
                  "cache_hits": getattr(getattr(c, "decision", None), "hits", None)}))
"""


def extract(rev: str, into: Path) -> Path:
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def child(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(args.seconds), str(args.period_s),
                          str(args.rate_hz)], capture_output=True, text=True, env=env, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"child in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


BENCH = Driver(
    baseline="the same child from a baseline git revision (--baseline), alternating",
    needs="a baseline revision (--baseline REV)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=None, help="git revision to compare against (extracted to a temp dir)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--period-s", type=float, default=0.05, help="the loop's monitor period")
    parser.add_argument("--rate-hz", type=float, default=200.0)
    parser.add_argument("--out", type=Path, default=None, help="write the raw results here (JSON)")
    args = parser.parse_args()
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline is not None:
            trees = {f"baseline {args.baseline}": extract(args.baseline, Path(tmp)), **trees}
        load_before = os.getloadavg()
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for rep in range(args.reps):
            for name, tree in trees.items():
                r = child(tree, args)
                results[name].append(r)
                print(f"rep {rep} {name:22s} ticks {r['ticks']:4d} switches {r['switches']:3d} "
                      f"decision p50 {r['decision_us_p50']:6.1f} us (cpu {r['decision_cpu_us_p50']:6.1f}) "
                      f"p95 {r['decision_us_p95']:6.1f} us  estimate p50 {r['estimate_us_p50']:6.1f} us  "
                      f"cache hits {r['cache_hits']}", flush=True)
        load_after = os.getloadavg()
    summary = {name: {"decision_us_p50_median": sorted(r["decision_us_p50"] for r in rs)[len(rs) // 2],
                      "decision_cpu_us_p50_median": sorted(r["decision_cpu_us_p50"] for r in rs)[len(rs) // 2]}
               for name, rs in results.items()}
    for name, s in summary.items():
        print(f"{name}: decision p50 (median of reps) {s['decision_us_p50_median']:.1f} us wall, "
              f"{s['decision_cpu_us_p50_median']:.1f} us CPU")
    print(f"load average before {load_before}, after {load_after}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                        "summary": summary, "load_before": load_before, "load_after": load_after,
                                        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "cpus": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
