"""What the serve loop saw, window by window, on issue 28's ORT scenario (idle, both cores busy, idle).

The scenario of the issue: the bundle's variants, requests at ``--rate-hz`` (CIFAR-10 test images
through the HTTP API), ``--phase-s`` idle, then the same with a busy process on every core, then
idle; the budget is ``--budget-factor`` x the largest variant's idle server-side p95 (calibrated
in the same run). Runs the adaptive loop (traced) and the static largest and smallest beside it.

The trace is summarised per ``--window-s`` window (not kept raw): the outside load index the loop
measured (now and forecast), each variant's estimate (the last of the window) and its source
(measured / scaled / prior / measured_few, the floors), the compute limit, what the decision
proposed and why, the active variant and the switcher's reason, and what the requests saw (sent,
missed, server p95, variants that answered).

    PYTHONPATH=$PWD python -m benchmarks.serve.loop_trace --bundle runs/demo/bundle-x86-64 --out trace.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver
from benchmarks.serve.oracle import available_mb
from benchmarks.serve.replay_common import REPLAY_API, calibrate_ms, export_cifar, machine_details, synthetic_bundle
from hmt.bundle import load_bundle
from hmt.serve.http.server import ServerOptions
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import SessionOptions, run_scenario


class Tracer:
    """Called after each tick of the adaptive run: what the loop saw (kept per tick, summarised later)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __call__(self, controller: Any, record: Any) -> None:
        est = controller.estimator
        estimates = est.estimates(controller.now_s(), controller.load_scale, record.load_forecast)
        decision = controller.last_decision
        limit_ms, _ = controller._latency_limit_ms(controller.budgets)
        self.rows.append({
            "time_s": record.time_s, "trigger": record.trigger, "cpu": record.cpu_util, "own": record.own_cpu_util,
            "load": record.load_index, "forecast": record.load_forecast, "limit_ms": limit_ms,
            "estimates": {e.arch_id: (round(e.latency_ms, 3), e.source, e.samples) for e in estimates},
            "proposed": record.proposed, "active": record.active, "switch_reason": record.switch_reason,
            "decision_reason": None if decision is None else decision.reason_code,
            "feasible": record.feasible,
            # cumulative: what shadow runs cost (their runs, their wall time, the runs a request overlapped)
            "shadow_runs": controller.stats.shadow_runs, "shadow_s": controller.stats.shadow_s,
            "shadow_overlapped": controller.shadow.overlapped})


def windows(trace: list[dict[str, Any]], records: list[Any], offset_s: float, end_s: float,
            window_s: float) -> list[dict[str, Any]]:
    """Per window: the ticks' view (medians, last estimates, decisions) and the requests' outcome."""
    out = []
    n = round(end_s / window_s)
    # The last tick before the window (the shadow counters are cumulative): at first, before the scenario.
    earlier = [t for t in trace if t["time_s"] - offset_s < 0]
    previous: dict[str, Any] | None = earlier[-1] if earlier else None
    for k in range(n):
        lo, hi = k * window_s, (k + 1) * window_s
        ticks = [t for t in trace if lo <= t["time_s"] - offset_s < hi]
        reqs = [r for r in records if lo <= r.time_s < hi]
        judged = [r for r in reqs if r.latency_budget_ms is not None]
        missed = [r for r in judged if not r.ok or r.latency_ms is None or r.latency_ms > r.latency_budget_ms]
        lat = [r.latency_ms for r in reqs if r.ok and r.latency_ms is not None]
        comp = [r.compute_ms for r in reqs if r.ok and r.compute_ms is not None]
        wait = [r.latency_ms - r.compute_ms for r in reqs
                if r.ok and r.latency_ms is not None and r.compute_ms is not None]
        row: dict[str, Any] = {"t_s": round(lo, 2), "sent": len(reqs), "missed": len(missed),
                               "p95_ms": round(float(np.percentile(lat, 95)), 3) if lat else None,
                               "compute_p95_ms": round(float(np.percentile(comp, 95)), 3) if comp else None,
                               "wait_p50_ms": round(float(np.percentile(wait, 50)), 3) if wait else None,
                               "wait_p95_ms": round(float(np.percentile(wait, 95)), 3) if wait else None,
                               "served": dict(Counter(r.variant for r in reqs if r.ok))}
        if ticks:
            last = ticks[-1]
            first = previous if previous is not None else ticks[0]
            previous = last
            owns = [t["own"] for t in ticks if t["own"] is not None]
            row.update(shadow_runs=last["shadow_runs"] - first["shadow_runs"],
                       shadow_ms=round(1e3 * (last["shadow_s"] - first["shadow_s"]), 3),
                       shadow_overlapped=last["shadow_overlapped"] - first["shadow_overlapped"],
                       own=round(statistics.median(owns), 3) if owns else None)
            row.update(ticks=len(ticks), load=round(statistics.median(t["load"] for t in ticks), 3),
                       forecast=round(statistics.median(t["forecast"] for t in ticks), 3),
                       cpu=round(statistics.median(t["cpu"] for t in ticks), 3),
                       limit_ms=round(last["limit_ms"], 3), estimates=last["estimates"],
                       proposed=dict(Counter(t["proposed"] for t in ticks)), active=last["active"],
                       decision_reasons=dict(Counter(t["decision_reason"] for t in ticks)),
                       switch_reasons=dict(Counter(t["switch_reason"] for t in ticks)))
        out.append(row)
    return out


def middle_phase(cpu_load: float, budget_step: float, squeeze_mb: float = 0.0) -> str:
    """The middle phase's name: what changes in it."""
    parts = ([f"{cpu_load:g} of the CPU busy" if cpu_load < 1 else "every core busy"] if cpu_load > 0 else []) + (
        [f"budget x{budget_step:g}"] if budget_step != 1 else []) + (
        [f"{squeeze_mb:g} MB squeezed"] if squeeze_mb > 0 else [])
    return ", ".join(parts) or "unchanged"


def phase_summary(rows: list[dict[str, Any]], phase_s: float, middle: str = "every core busy") -> list[dict[str, Any]]:
    """Per phase: requests, misses, the median load, and per variant how often its estimate was
    within the limit and from which source."""
    out = []
    for p, name in enumerate(("idle", middle, "idle again")):
        part = [r for r in rows if p * phase_s <= r["t_s"] < (p + 1) * phase_s]
        sent = sum(r["sent"] for r in part)
        missed = sum(r["missed"] for r in part)
        with_ticks = [r for r in part if "estimates" in r]
        per_variant: dict[str, Any] = {}
        for r in with_ticks:
            for arch_id, (ms, source, _) in r["estimates"].items():
                entry = per_variant.setdefault(arch_id, {"within_limit": 0, "windows": 0, "sources": Counter(),
                                                         "estimate_ms": []})
                entry["windows"] += 1
                entry["within_limit"] += ms <= r["limit_ms"]
                entry["sources"][source] += 1
                entry["estimate_ms"].append(ms)
        for entry in per_variant.values():
            entry["estimate_ms_median"] = round(statistics.median(entry.pop("estimate_ms")), 3)
            entry["sources"] = dict(entry["sources"])
        out.append({"phase": name, "sent": sent, "missed": missed,
                    "miss_share": missed / sent if sent else None,
                    "shadow_runs": sum(r.get("shadow_runs", 0) for r in part),
                    "shadow_ms": round(sum(r.get("shadow_ms", 0.0) for r in part), 3),
                    "load_median": statistics.median(r["load"] for r in with_ticks) if with_ticks else None,
                    "served": dict(sum((Counter(r["served"]) for r in part), Counter())),
                    "per_variant": per_variant})
    return out


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for name, run in report["runs"].items():
        phases = run["phases"]
        claims.append({"claim": f"{name}: deadline misses per phase ({' / '.join(p['phase'] for p in phases)}), budget "
                                f"{report['budget_ms']:.2f} ms, {report['engine']}",
                       "figure": " / ".join(f"{p['missed']}/{p['sent']}" for p in phases)
                                 + f"; {run['switches']} switches"})
    adaptive = report["runs"]["adaptive"]["phases"]
    claims.append({"claim": "median outside load index the loop measured per phase",
                   "figure": " / ".join("-" if p["load_median"] is None else f"{p['load_median']:.2f}"
                                        for p in adaptive)})
    return claims


BENCH = Driver(
    baseline="static largest and static smallest variant over the same scenario, in the same run",
    claims=_claims,
    quick=["--synthetic", "--phase-s", "2", "--out", "{report}"],
    default=["--bundle", "runs/demo/bundle-x86-64", "--out", "{report}"],
    needs="the demo bundle (bash scripts/demo.sh) for the default run",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=None)
    parser.add_argument("--synthetic", action="store_true", help="a synthetic MatMul bundle (the quick path)")
    parser.add_argument("--engine", default="onnxruntime")
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--rate-hz", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--budget-factor", type=float, default=1.3)
    parser.add_argument("--budget-ms", type=float, default=None,
                        help="a fixed latency budget (ms) instead of one calibrated in the run")
    parser.add_argument("--cpu-load", type=float, default=1.0,
                        help="the busy phase's share of the CPU taken by other work (burners; 1.0: all of it)")
    parser.add_argument("--budget-step", type=float, default=1.0,
                        help="the middle phase's latency budget as a factor of the others' (issue 28's budget shape: "
                             "0.6 with --cpu-load 0)")
    parser.add_argument("--static", action="append", default=None, metavar="VARIANT",
                        help="a static run beside the adaptive one: largest, smallest, middle (by profiled "
                             "latency, the lower of two) "
                             "or an arch id; repeatable (default: largest and smallest)")
    parser.add_argument("--client-processes", action="store_true",
                        help="clients in processes of their own (as the matrix's --client-processes)")
    parser.add_argument("--squeeze-headroom-mb", type=float, default=0.0,
                        help="a memory squeeze in the middle phase instead (the matrix's squeeze shape): serve keeps "
                             "all but this much of the available memory free and the squeeze takes twice this "
                             "(0: none)")
    parser.add_argument("--window-s", type=float, default=0.5)
    parser.add_argument("--serve-json", default="{}", help="serve.json overrides of the adaptive run (JSON)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.budget_ms is not None and not (math.isfinite(args.budget_ms) and args.budget_ms > 0):
        parser.error(f"--budget-ms {args.budget_ms}: expected a number of ms > 0")
    if not 0.0 <= args.cpu_load <= 1.0:
        parser.error(f"--cpu-load {args.cpu_load}: expected a share of the CPU in [0, 1]")
    if not (math.isfinite(args.budget_step) and args.budget_step > 0):
        parser.error(f"--budget-step {args.budget_step}: expected a factor > 0")
    if not (math.isfinite(args.squeeze_headroom_mb) and args.squeeze_headroom_mb >= 0):
        parser.error(f"--squeeze-headroom-mb {args.squeeze_headroom_mb}: expected MB >= 0")
    with tempfile.TemporaryDirectory(prefix="hmt-loop-trace-") as tmp:
        work = Path(tmp)
        if args.synthetic:
            bundle_path, data = synthetic_bundle(work / "bundle"), None
        else:
            if args.bundle is None:
                parser.error("--bundle or --synthetic")
            bundle_path, data = args.bundle, None
        bundle = load_bundle(bundle_path)
        variants = sorted(bundle.spec.variants, key=lambda v: v.latency_ms)
        largest = max(variants, key=lambda v: v.accuracy).arch_id
        smallest = variants[0].arch_id
        named = {"largest": largest, "smallest": smallest, "middle": variants[(len(variants) - 1) // 2].arch_id}
        statics = []
        for want in args.static or ["largest", "smallest"]:
            if want not in named and want not in {v.arch_id for v in variants}:
                parser.error(f"--static {want}: expected largest, smallest, middle or one of the bundle's arch ids")
            statics.append((f"static_{want}" if want in named else f"static {want}", named.get(want, want)))
        if not args.synthetic:  # after the options are checked against the bundle
            data = export_cifar(work / "cifar.npz")
        idle_p95 = None
        if args.budget_ms is None:
            idle_p95 = calibrate_ms(bundle_path, largest, data, engine=args.engine, rate_hz=args.rate_hz,
                                    clients=args.clients)
        budget_ms = args.budget_ms if args.budget_ms is not None else args.budget_factor * idle_p95
        p = args.phase_s
        load = f"{args.cpu_load:g}" if args.cpu_load > 0 else ""
        squeeze = f"{2 * args.squeeze_headroom_mb:g}" if args.squeeze_headroom_mb > 0 else ""
        scenario = Scenario.from_text(f"time_s,cpu_load,latency_budget_ms,memory_squeeze_mb\n0,,{budget_ms:.4f},\n"
                                      f"{p:g},{load},{args.budget_step * budget_ms:.4f},{squeeze}\n"
                                      f"{2 * p:g},,{budget_ms:.4f},\n")
        # As the matrix's squeeze shape: every run keeps all but the headroom of what is available now free.
        reserve = {"memory_reserve_mb": max(0.0, available_mb() - args.squeeze_headroom_mb)} if squeeze else {}
        overrides = {**json.loads(args.serve_json), **reserve}
        drive = DriveOptions(duration_s=3 * p, clients=args.clients, rate_hz=args.rate_hz, load_mode="burn",
                             client_mode="processes" if args.client_processes else "threads")
        api = REPLAY_API
        report: dict[str, Any] = {"bundle": "synthetic" if args.synthetic else bundle_path.name,
                                  "engine": args.engine, "rate_hz": args.rate_hz, "phase_s": p,
                                  "budget_ms": budget_ms, "budget_step": args.budget_step,
                                  "squeeze_headroom_mb": args.squeeze_headroom_mb,
                                  "largest_idle_p95_ms": idle_p95,
                                  "variants": {v.arch_id: {"accuracy": v.accuracy, "latency_ms_profile": v.latency_ms}
                                               for v in variants},
                                  "machine_details": machine_details(), "runs": {}}
        for name, fixed in [("adaptive", None), *statics]:
            tracer = Tracer() if fixed is None else None
            result = run_scenario(bundle_path, scenario,
                                  SessionOptions(engine=args.engine, fixed_variant=fixed,
                                                 serve_overrides=overrides if fixed is None else reserve),
                                  drive, api=api, server=ServerOptions(port=0), data=data,
                                  rng=np.random.default_rng(0), label=name, trace=tracer)
            rows = []
            if tracer is not None:
                # Tick times are the controller's; the requests' are the scenario's: align on the ticks kept.
                offset = tracer.rows[-1]["time_s"] - result.ticks[-1].time_s if result.ticks else 0.0
                rows = windows(tracer.rows, result.records, offset, 3 * p, args.window_s)
            else:
                rows = windows([], result.records, 0.0, 3 * p, args.window_s)
            report["runs"][name] = {"switches": result.summary["switches"],
                                    "phases": phase_summary(rows, p, middle_phase(args.cpu_load, args.budget_step,
                                                                             2 * args.squeeze_headroom_mb)),
                                    **({"windows": rows} if tracer is not None else {})}
            busy = report["runs"][name]["phases"][1]
            print(f"{name}: middle-phase misses {busy['missed']}/{busy['sent']}, switches "
                  f"{result.summary['switches']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
