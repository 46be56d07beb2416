"""Benchmark of ``hmt serve`` on this machine: a scripted scenario, static baselines, and a load test.

1. Exports the embedded CIFAR-10 test subset, normalised as in training, to an .npz
   (x, y): the labelled data every phase sends through the HTTP API.
2. Calibrates the latency budget: a short unloaded run of the largest variant through
   the API; budget = ``--budget-factor`` x its p95 server latency (queue wait + compute).
3. Replays one scenario (real background load: processes burning a core; battery
   falling; a memory cut that leaves only the smaller variants) three times per
   repetition, in the same run: adaptive, static largest, static smallest.
4. Load test: ``--load-clients`` concurrent clients as fast as they can go, while the
   latency budget flips every second between a tight and a loose value so that the
   variant switches every second (switch policy relaxed for it); counts failures.

Writes ``OUT/results.json`` and, for the first adaptive repetition, its timeline
(``OUT/timeline_adaptive.png`` + CSVs). This script may use the offline dependencies
(the data loader); the serve path it drives does not.

    python -m benchmarks.serve.scenario --bundle runs/demo/bundle-x86-64 --out runs/bench-serve

The scenario has both cores busy, one core busy, a memory cut and a battery drain; with
``--engines tvm`` on a bundle profiled for ONNX Runtime the engine's latencies differ from
the profile's by 15-60x, which the loop has to learn from its own measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver
from hmt.bundle import load_bundle
from hmt.serve.http.api import ApiOptions
from hmt.serve.http.server import ServerOptions
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import ScenarioResult, SessionOptions, run_scenario

SUMMARY_KEYS = ("requests", "ok", "failed", "failed_by_status", "latency_ms", "compute_ms", "client_ms",
                "latency_over_budget", "judged", "deadline_misses", "deadline_miss_share", "accuracy", "labelled",
                "switches", "decisions", "decision_us", "decision_cpu_us", "estimate_us", "per_exit", "per_variant",
                "steps",
                "back_within_budget_s_max", "steps_never_back", "first_clean_window_s_max", "steps_never_clean",
                "client_over_budget_share", "engine", "fixed_variant", "burn", "control_loop_errors",
                "control_loop_last_error", "driver_late_max_s", "rows_applied_on_sample")


def machine() -> dict[str, Any]:
    from hmt.profile.parsers import parse_cpuinfo

    try:
        model = str(parse_cpuinfo(Path("/proc/cpuinfo").read_text()).get("model", ""))
    except OSError:
        model = ""
    import onnxruntime

    return {"cpu": model, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__}


def export_cifar(path: Path, limit: int | None) -> Path:
    from hmt.data.load import load_dataset

    data = load_dataset("cifar10")
    mean = np.asarray(data.info.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(data.info.std, dtype=np.float32).reshape(1, -1, 1, 1)
    x = ((data.test_x.astype(np.float32) / 255.0 - mean) / std).astype(np.float32)
    y = data.test_y.astype(np.int64)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    np.savez(path, x=x, y=y)
    return path


def scenario_text(budget_ms: float, memory_cut_mb: float, phase_s: float, load: bool = True) -> str:
    """Idle -> one core busy -> both cores busy -> idle -> memory cut -> cut + one core busy -> idle,
    with the battery draining throughout (100% -> 30%: mu falls, energy weighs more).

    ``load=False``: the same budgets and battery without the busy cores (the unloaded choice).
    """
    p = phase_s
    one = "0.5" if load else ""
    both = "1.0" if load else ""
    rows = [
        "time_s,cpu_load,memory_budget_mb,battery_pct,latency_budget_ms",
        f"0,,,100,{budget_ms:.4f}",
        f"{p:g},{one},,90,{budget_ms:.4f}",  # one of two cores busy
        f"{2 * p:g},{both},,80,{budget_ms:.4f}",  # both cores busy
        f"{3 * p:g},,,70,{budget_ms:.4f}",
        f"{4 * p:g},,{memory_cut_mb:.4f},60,{budget_ms:.4f}",  # memory cut
        f"{5 * p:g},{one},{memory_cut_mb:.4f},45,{budget_ms:.4f}",  # cut + load
        f"{6 * p:g},,,30,{budget_ms:.4f}",
        f"{7 * p:g},,,30,{budget_ms:.4f}",
    ]
    return "\n".join(rows) + "\n"


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the repetitions of the headline numbers (and their spread)."""
    def values(get: Any) -> list[float]:
        return [float(v) for v in (get(r) for r in runs) if v is not None]

    out: dict[str, Any] = {}
    for name, get in (("latency_p50_ms", lambda r: (r["latency_ms"] or {}).get("p50")),
                      ("latency_p95_ms", lambda r: (r["latency_ms"] or {}).get("p95")),
                      ("deadline_miss_share", lambda r: r["deadline_miss_share"]),
                      ("accuracy", lambda r: r["accuracy"]),
                      ("switches", lambda r: r["switches"]),
                      ("decision_us_p50", lambda r: (r["decision_us"] or {}).get("p50")),
                      ("decision_cpu_us_p50", lambda r: (r.get("decision_cpu_us") or {}).get("p50")),
                      ("estimate_us_p50", lambda r: (r.get("estimate_us") or {}).get("p50")),
                      ("back_within_budget_s_max", lambda r: r["back_within_budget_s_max"]),
                      ("first_clean_window_s_max", lambda r: r["first_clean_window_s_max"]),
                      ("client_over_budget_share", lambda r: r["client_over_budget_share"]),
                      ("failed", lambda r: r["failed"])):
        v = values(get)
        out[name] = {"mean": float(np.mean(v)), "min": min(v), "max": max(v)} if v else None
    return out


def trimmed(result: ScenarioResult) -> dict[str, Any]:
    return {k: result.summary.get(k) for k in SUMMARY_KEYS}


def run(bundle: Path, scenario: Scenario, duration_s: float, data: Path, *, fixed: str | None, clients: int,
        rate_hz: float, overrides: dict[str, Any] | None = None, timeline: Path | None = None,
        label: str = "", load_mode: str = "burn", deadline_ms: float = 2000.0,
        client_mode: str = "processes", engine: str = "auto", threads: int | None = None) -> ScenarioResult:
    session = SessionOptions(engine=engine, fixed_variant=fixed, serve_overrides=overrides or {}, threads=threads)
    drive = DriveOptions(duration_s=duration_s, clients=clients, rate_hz=rate_hz, load_mode=load_mode,
                         client_mode=client_mode)
    return run_scenario(bundle, scenario, session, drive, api=ApiOptions(max_queue=64, workers=2,
                                                                         deadline_ms=deadline_ms),
                        server=ServerOptions(port=0), data=data, timeline_dir=timeline,
                        rng=np.random.default_rng(0), label=label)


def bench_engine(args: argparse.Namespace, spec: str, bundle: Any, data: Path, largest: str, smallest: str,
                 work: Path) -> dict[str, Any]:
    """Calibration + the scenario (adaptive, static largest, static smallest) on one engine.

    ``spec``: an engine, or ``engine@N`` to run every graph on N intra-op threads instead of
    fuse's per-variant choice (``hmt serve --threads N``)."""
    engine, _, threads_text = spec.partition("@")
    threads = int(threads_text) if threads_text else None
    # Bundle predictions are for the preferred engine (ONNX Runtime here); the untuned TVM
    # build runs 15-40x slower than predicted: the loop must learn that from its measurements
    # (no override of the correction: r is never clipped any more).
    overrides: dict[str, Any] = dict(args.overrides)
    rate_hz = args.tvm_rate_hz if engine == "tvm" else args.rate_hz
    out: dict[str, Any] = {"rate_hz": rate_hz}
    # 1. Budget calibration: the largest variant, unloaded, through the API.
    calib = run(args.bundle, Scenario.from_text("time_s\n0\n"), 5.0, data, fixed=largest,
                clients=args.clients, rate_hz=rate_hz, load_mode="synthetic", label="calibration",
                engine=engine, overrides=overrides, threads=threads)
    if calib.summary["latency_ms"] is None:  # no request answered: say what the clients saw
        seen = {k: calib.summary.get(k) for k in ("requests", "ok", "failed", "failed_by_status")}
        raise RuntimeError(f"the budget calibration (the largest variant, unloaded, 5 s) answered no request: {seen}")
    largest_p95 = calib.summary["latency_ms"]["p95"]
    # A fixed --budget-ms keeps one noisy calibration (a shared VM) from making the budget meaningless.
    fixed_ms = args.tvm_budget_ms if engine == "tvm" and args.tvm_budget_ms is not None else args.budget_ms
    budget_ms = fixed_ms if fixed_ms is not None else args.budget_factor * largest_p95
    # The memory cut leaves the smaller half of the variants (by memory).
    by_memory = sorted(v.memory_mb for v in bundle.spec.variants)
    memory_cut_mb = by_memory[len(by_memory) // 2 - 1] * 1.001
    out["calibration"] = {"largest_unloaded": trimmed(calib), "budget_ms": budget_ms,
                          "budget_factor": args.budget_factor, "memory_cut_mb": memory_cut_mb}
    print(f"{spec}: budget {budget_ms:.3f} ms (largest unloaded p95 {largest_p95:.3f} ms); "
          f"memory cut {memory_cut_mb:.3f} MB", flush=True)

    # 2. The scenario, adaptive and static, in the same run.
    text = scenario_text(budget_ms, memory_cut_mb, args.phase_s)
    (args.out / f"scenario_{spec}.csv").write_text(text)
    scenario = Scenario.from_text(text)
    unloaded = Scenario.from_text(scenario_text(budget_ms, memory_cut_mb, args.phase_s, load=False))
    duration = scenario.end_s
    modes = [("adaptive", None), ("adaptive_unloaded", None), ("static_largest", largest),
             ("static_smallest", smallest)]
    extra = dict(args.extra_modes)
    modes[1:1] = [(name, None) for name in extra]
    if args.with_profile_only:
        # The ablation: the same loop deciding on the profile's predictions alone (x load model).
        modes.insert(1, ("adaptive_profile_only", None))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m, _ in modes}
    for rep in range(args.reps):
        for mode, fixed in modes:
            timeline = work / f"tl_{spec}_{mode}_{rep}"
            result = run(args.bundle, unloaded if mode == "adaptive_unloaded" else scenario, duration, data,
                         fixed=fixed, clients=args.clients, threads=threads,
                         rate_hz=rate_hz, timeline=timeline, label=f"{spec} {mode} (rep {rep})",
                         engine=engine, overrides={**overrides, "estimates": {"mode": "predicted"}}
                         if mode == "adaptive_profile_only" else {**overrides, **extra[mode]} if mode in extra
                         else overrides)
            runs[mode].append(trimmed(result))
            s = result.summary
            print(f"{spec} rep {rep} {mode:16s} p95 {s['latency_ms']['p95']:.3f} ms  miss "
                  f"{100 * (s['deadline_miss_share'] or 0):.2f}%  acc {100 * (s['accuracy'] or 0):.2f}%  "
                  f"switches {s['switches']}  first clean {s['first_clean_window_s_max']}  "
                  f"settled {s['back_within_budget_s_max']}  client miss "
                  f"{100 * (s['client_over_budget_share'] or 0):.2f}%  decision p50 "
                  f"{(s['decision_us'] or {}).get('p50', float('nan')):.1f} us  failed {s['failed']}", flush=True)
            print("    per step (misses/judged, first clean s, settled s): " + "  ".join(
                f"{st['time_s']:g}s {st['misses']}/{st['judged']} {st['first_clean_window_s']} "
                f"{st['back_within_budget_s']}" for st in s["steps"]), flush=True)
            if rep == 0:
                # Per-request records (~0.4 MB a run) only for the adaptive run.
                names = ("timeline.png", "timeline.csv", "requests.csv") if mode == "adaptive" else (
                    "timeline.png", "timeline.csv")
                for name in names:
                    if (timeline / name).exists():
                        stem, ext = name.rsplit(".", 1)
                        shutil.copy(timeline / name, args.out / f"{stem}_{spec}_{mode}.{ext}")
    out["scenario"] = {"duration_s": duration, "budget_ms": budget_ms, "runs": runs,
                       "mean": {m: aggregate(r) for m, r in runs.items()}}
    out["budget_ms"] = budget_ms
    return out


BENCH = Driver(
    baseline="static largest and static smallest over the same scenario, each repetition",
    needs="a deploy bundle (--bundle) and several minutes",
    report="{tmp}/out/results.json",
    out_args=("--out", "{tmp}/out"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-serve"))
    parser.add_argument("--phase-s", type=float, default=6.0, help="length of each scenario phase")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rate-hz", type=float, default=100.0)
    parser.add_argument("--tvm-rate-hz", type=float, default=80.0, help="request rate of the TVM phases")
    parser.add_argument("--budget-factor", type=float, default=1.3)
    parser.add_argument("--budget-ms", type=float, default=None, help="fixed latency budget instead of calibrating")
    parser.add_argument("--tvm-budget-ms", type=float, default=None, help="fixed budget of the TVM phases")
    parser.add_argument("--results-name", default="results.json")
    parser.add_argument("--samples", type=int, default=None, help="use only the first N test images")
    parser.add_argument("--load-s", type=float, default=180.0, help="load-test length (0: skip)")
    parser.add_argument("--load-clients", type=int, default=16)
    parser.add_argument("--engines", default="onnxruntime,tvm", help="comma-separated; the load test uses the first")
    parser.add_argument("--serve-json", default="{}",
                        help="serve.json overrides for every run, as JSON (e.g. '{\"estimates\": {\"mode\": "
                             "\"predicted\"}}' for the profile-only ablation)")
    parser.add_argument("--with-profile-only", action="store_true",
                        help="also run the loop on the profile's predictions alone (estimates.mode predicted)")
    parser.add_argument("--extra-mode", action="append", default=[], metavar="NAME=JSON",
                        help="an adaptive run with these serve.json overrides, in the same run (repeatable)")
    args = parser.parse_args()
    args.overrides = json.loads(args.serve_json)
    args.extra_modes = [(text.partition("=")[0], json.loads(text.partition("=")[2])) for text in args.extra_mode]

    args.out.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(args.bundle)
    variants = sorted(bundle.spec.variants, key=lambda v: v.latency_ms)
    smallest, largest = variants[0], max(bundle.spec.variants, key=lambda v: v.accuracy)
    work = Path(tempfile.mkdtemp(prefix="hmt-bench-serve-"))
    report: dict[str, Any] = {"machine": machine(), "bundle": str(args.bundle),
                              "variants": [{"arch_id": v.arch_id, "exit_stage": v.exit_stage, "accuracy": v.accuracy,
                                            "latency_ms_predicted": v.latency_ms, "memory_mb": v.memory_mb,
                                            "engine": v.preferred_engine} for v in variants],
                              "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        data = export_cifar(work / "cifar_test.npz", args.samples)
        report["data"] = {"samples": len(np.load(data)["y"]), "source": "embedded CIFAR-10 test subset"}

        engines = [e.strip() for e in args.engines.split(",") if e.strip()]
        report["engines"] = {}
        for engine in engines:
            report["engines"][engine] = bench_engine(args, engine, bundle, data, largest.arch_id, smallest.arch_id,
                                                     work)
        budget_ms = report["engines"][engines[0]]["budget_ms"]
        engine = engines[0].partition("@")[0]

        # 3. Load test: the variant switches every second under many concurrent clients.
        if args.load_s > 0:
            tight = 0.5 * budget_ms
            rows = ["time_s,latency_budget_ms"] + [f"{t},{tight if t % 2 else 4 * budget_ms:.4f}"
                                                    for t in range(int(args.load_s))]
            flip = Scenario.from_text("\n".join(rows) + "\n")
            fast = {"switch": {"min_dwell_s": 0.0, "violation_patience": 1, "improve_patience": 1,
                               "score_margin": 0.0}}
            t0 = time.monotonic()
            result = run(args.bundle, flip, args.load_s, data, fixed=None, clients=args.load_clients,
                         rate_hz=args.load_clients * 200.0, overrides=fast, load_mode="synthetic",
                         label="load test", deadline_ms=10000.0, engine=engine)
            s = result.summary
            report["load_test"] = {"wall_s": time.monotonic() - t0, "clients": args.load_clients,
                                   **trimmed(result),
                                   "throughput_rps": s["requests"] / args.load_s}
            print(f"load test: {s['requests']} requests, {s['failed']} failed, {s['switches']} switches, "
                  f"{s['requests'] / args.load_s:.0f} req/s, client p95 {s['client_ms']['p95']:.2f} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (args.out / args.results_name).write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    print(f"wrote {args.out / args.results_name}")


if __name__ == "__main__":
    main()
