"""How latency inside a CFS-quota device class depends on work size, period and request pattern.

    python -m benchmarks.device.class_throttle [--quick] [--out PATH]

A calibrated single-thread CPU loop of ``w`` ms of CPU time (its own ``thread_time``) runs inside a
class (one core at a share, or two cores at a share each) whose CFS period is set per case. Two request
patterns:

* ``isolated``: one call, then an idle gap longer than the period (the quota refills, and a call starts
  at a random phase of the period), as serve's requests at a few per second;
* ``sustained``: calls back to back (a throughput run, as a profiler's repeat loop or a saturated server).

Per case: wall p10/p50/p90 and mean per call, divided by ``w / share`` (what a uniformly slower CPU of
that speed would take: 1.0 everywhere if the class were one). The baseline, in the same run: the same
calls outside any class (ratio to ``w``).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.device.device_class import CLASSES, CgroupUnavailable, DeviceClass, layout, run_in_class
from benchmarks.harness import Driver, machine, make_result, write_result

RESULTS = Path(__file__).parent / "results"
SEED = 0


def _summary(report: Any) -> Any:
    return report.get("results", report)


def _claims(report: Any) -> list[dict[str, str]]:
    return list(report.get("claims", []))


BENCH = Driver(
    baseline="the same calls outside any class (wall per call against the call's CPU time)",
    quick=["--quick", "--out", "{report}"],
    default=["--out", "{report}"],
    seed=SEED,
    summarise=_summary,
    claims=_claims,
    timeout_s=1800,
)

# --------------------------------------------------------------------------- the child (inside the class)


def _spin(iterations: int) -> None:
    x = 0
    for i in range(iterations):
        x ^= i


def _iterations_per_ms() -> float:
    """Loop iterations per ms of this thread's CPU time (CPU time is not stretched by a quota)."""
    n = 200_000
    rates = []
    for _ in range(5):
        c0 = time.thread_time()
        _spin(n)
        rates.append(n / ((time.thread_time() - c0) * 1e3))
    return statistics.median(rates)


def run_calls(work_ms: list[float], pattern: str, calls: int, gap_ms: float, seed: int) -> dict[str, Any]:
    """Per work size: wall ms of each call (sorted quantiles and mean) and the calls' CPU ms."""
    rng = random.Random(seed)
    per_ms = _iterations_per_ms()
    out: dict[str, Any] = {}
    for w in work_ms:
        n = max(1, round(w * per_ms))
        for _ in range(3):
            _spin(n)
        walls, cpus = [], []
        for _ in range(calls):
            if pattern == "isolated":
                time.sleep((gap_ms + rng.uniform(0, gap_ms)) / 1e3)
            c0, t0 = time.thread_time(), time.perf_counter()
            _spin(n)
            walls.append((time.perf_counter() - t0) * 1e3)
            cpus.append((time.thread_time() - c0) * 1e3)
        q = statistics.quantiles(walls, n=10)
        out[str(w)] = {"cpu_ms": statistics.median(cpus), "p10_ms": q[0], "p50_ms": statistics.median(walls),
                       "p90_ms": q[-1], "mean_ms": statistics.fmean(walls), "calls": calls}
    return out


# --------------------------------------------------------------------------- the parent


def _measure(device_class: DeviceClass | None, work_ms: list[float], pattern: str, calls: int, gap_ms: float,
             seed: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.device.class_throttle", "child", json.dumps(work_ms), pattern,
            str(calls), str(gap_ms), str(seed)]
    if device_class is None:
        done = subprocess.run(argv, capture_output=True, timeout=900)
    else:
        done = run_in_class(device_class, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout_s=900)
    if done.returncode != 0:
        raise RuntimeError(f"class_throttle child failed: {done.stderr.decode()[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout.decode())
    return result


def _ratios(raw: dict[str, Any], share: float) -> dict[str, Any]:
    """Each work size's wall figures over what a uniformly slower CPU would take (cpu_ms / share)."""
    out = {}
    for w, r in raw.items():
        slow = r["cpu_ms"] / share
        out[w] = {"cpu_ms": round(r["cpu_ms"], 3), "uniform_ms": round(slow, 3),
                  **{f"{k[:-3]}_ratio": round(r[k] / slow, 3) for k in ("p10_ms", "p50_ms", "p90_ms", "mean_ms")}}
    return out


def cases(quick: bool) -> list[tuple[str, str, list[int]]]:
    """(class, mechanism, CFS periods or pacer cycles in us) measured."""
    if quick:
        return [("rpi4-class", "cfs", [4_000]), ("rpi4-class", "pacer", [1_000])]
    return [("rpi4-class", "cfs", [4_000, 100_000]), ("rpi4-class", "pacer", [1_000]),
            ("nano-class", "cfs", [4_000]), ("nano-class", "pacer", [1_000])]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        work, pattern, calls, gap, seed = json.loads(argv[1]), argv[2], int(argv[3]), float(argv[4]), int(argv[5])
        print(json.dumps(run_calls(work, pattern, calls, gap, seed)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    typed = shlex.join(["python", "-m", "benchmarks.device.class_throttle", *argv])
    out = args.out or (Path(tempfile.mkdtemp(prefix="hmt-bench-throttle-")) / "class_throttle.json" if args.quick
                       else RESULTS / "class_throttle.json")
    work = [0.5, 2.0] if args.quick else [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    calls = 15 if args.quick else args.calls
    info = {**machine(), "note": "shared machine (other developers' jobs running); single-thread CPU loop"}
    results: dict[str, Any] = {"work_ms": work, "calls_per_case": calls}
    claims: list[dict[str, str]] = []
    baseline = {p: _ratios(_measure(None, work, p, calls, 5.0, args.seed), 1.0) for p in ("isolated", "sustained")}
    results["baseline_no_class"] = baseline
    try:
        layout()
        import os
        if os.geteuid() != 0:
            raise CgroupUnavailable("writing cgroups needs root")
    except CgroupUnavailable as exc:
        results["skipped"] = str(exc)
        write_result(out, make_result(area="device", name="class_throttle", command=typed, seed=args.seed,
                                      baseline=BENCH.baseline, results=results, claims=[], machine_info=info))
        return 0
    per: dict[str, Any] = {}
    for name, mechanism, periods in cases(args.quick):
        base = CLASSES[name]
        for period in periods:
            dclass = replace(base, mechanism=mechanism, period_override_us=period)
            key = f"{name} {mechanism}@{period}us"
            gap = max(20.0, 1.2 * period / 1e3)  # more than a period: the quota has refilled
            per[key] = {"mechanism": mechanism, "period_us": period, "share": dclass.cpu_budget,
                        "quota_us": dclass.quota_us if mechanism == "cfs" else None,
                        **{p: _ratios(_measure(dclass, work, p, calls, gap, args.seed), dclass.cpu_budget)
                           for p in ("isolated", "sustained")}}
            ratios = {p: {w: (v["p50_ratio"], v["mean_ratio"]) for w, v in per[key][p].items()}
                      for p in ("isolated", "sustained")}
            print(f"{key}: {json.dumps(ratios)}", file=sys.stderr, flush=True)
    results["classes"] = per
    sizes = "/".join(f"{w:g}" for w in work)
    for key, r in per.items():
        figure = "; ".join(f"{p} " + " ".join(f"{v['p50_ratio']:.2f}" for v in r[p].values())
                           for p in ("sustained", "isolated"))
        claims.append({"claim": f"{key}: p50 wall per call over (CPU time / budget), 1.00 = a uniformly slower CPU, "
                                f"for calls of {sizes} ms of CPU", "figure": figure})
    write_result(out, make_result(area="device", name="class_throttle", command=typed, seed=args.seed,
                                  baseline=BENCH.baseline, results=results, claims=claims, machine_info=info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
