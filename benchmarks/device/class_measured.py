"""Device classes measured, not estimated: profile inside an emulated class, predict, deploy, measure there.

    python -m benchmarks.device.class_measured [--quick] [--classes rpi4-class,nano-class] [--reps 3] [--out PATH]

Per class of ``benchmarks/device/device_class.py`` (pinned cores, a CPU budget kept every millisecond by
the pacer):

1. ``hmt profile-device --quick --supernet <shipped supernet>`` runs *inside* the class (micro-
   benchmarks, probe layers, block table); it measures the thread count (the fewest ONNX Runtime
   threads within 5 % of the fastest for the largest variant, inside the class), unless ``--threads
   CLASS=N`` fixes it; the later repetitions' profiles, the measurement and serve use the bundle's;
2. ``hmt pareto`` predicts from that profile (on the host: accuracy is not the device's business),
   then ``convert``, ``fuse`` (ONNX Runtime) and ``deploy --target x86-64 --profile <class profile>``
   make the bundle;
3. every bundle variant is loaded as serve loads it (hmt.runtime) inside the class and timed end to
   end (batch 1, all its segments and its exit, back to back): measured p50 against the prediction
   from the class's profile. The baseline, in the same run: the prediction from the host's own profile
   (measured unthrottled, the figure a user without the class would have had) for the same variants;
4. ``benchmarks.serve.scenario`` runs inside the class (server, its clients and the scenario's busy
   processes all share the class's CPU budget): adaptive against static largest and smallest under
   the same busy phases as on the host. The busy processes are sized to the class, not the host
   (``hmt.serve.running.burn``): one per class core, so ``cpu_load`` 0.5 is half of the class's CPU, as
   other work on the board would take.

``--reps`` repetitions of 1 (a fresh profile inside the class each time; the bundle is built from the
first), 3 and 4; per variant the medians over repetitions are compared. The Jetson and Raspberry Pi
profiles shipped in ``profiles/`` stay what they are, datasheet estimates; a class is an x86 core at a
budget (no Arm caches or memory system), measured. ``--quick`` only checks the classes (a busy loop's
CPU share inside each) and writes to a temporary folder; without writable cgroups it says so and skips.
A full run takes about an hour on the 2-core development VM (it is CPU-bound: run it under ``nice``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.device.device_class import (
    CLASSES,
    CgroupUnavailable,
    DeviceClass,
    child_error,
    cpu_seconds_per_second,
    layout,
    run_in_class,
    terminate_as_exit,
)
from benchmarks.device.pacer import CYCLE_US
from benchmarks.harness import EMBEDDED_SUPERNET, REPO, Driver, machine, make_result, write_result

RESULTS = Path(__file__).parent / "results"
SEED = 0
TOLERANCE = 0.15
THREADS: dict[str, int] = {}  # --threads CLASS=N; otherwise profile-device measures the count
RATE_HZ = {"rpi4-class": 8.0, "nano-class": 20.0}


def _summary(report: Any) -> Any:
    return report.get("results", report)


def _claims(report: Any) -> list[dict[str, str]]:
    return list(report.get("claims", []))


BENCH = Driver(
    baseline="the same variants predicted from the host's own (unthrottled) profile; static largest and smallest "
             "serving the same scenario in the class",
    quick=["--quick", "--out", "{report}"],
    default=["--out", "{report}"],
    seed=SEED,
    summarise=_summary,
    claims=_claims,
    timeout_s=7200,
)


def _log(text: str) -> None:
    print(f"[class_measured] {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _hmt(args: list[str], *, device_class: str | None = None, timeout_s: float = 3600) -> float:
    """Run ``python -m commands ARGS`` (inside the class when given); its wall time in s."""
    argv = [sys.executable, "-m", "commands", *args, "--quiet"]
    started = time.monotonic()
    if device_class is None:
        done = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, timeout=timeout_s)
    else:
        done = run_in_class(CLASSES[device_class], argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout_s=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"hmt {args[0]} exited {done.returncode}: {done.stderr.decode()[-1500:]}")
    return time.monotonic() - started


# --------------------------------------------------------------------------- inside the class


def measure_bundle(bundle_dir: Path, threads: int, repeats: int, seed: int) -> dict[str, Any]:
    """Every variant of the bundle loaded as serve loads it, timed end to end at batch 1 (ms)."""
    import numpy as np

    from hmt.bundle import load_bundle
    from hmt.runtime.variant import example_input, load_variant

    bundle = load_bundle(bundle_dir)
    x = example_input(bundle, np.random.default_rng(seed))
    out: dict[str, Any] = {"cpu_affinity": sorted(os.sched_getaffinity(0)), "threads": threads, "variants": {}}
    for variant in bundle.spec.variants:
        runner = load_variant(bundle, variant.arch_id, "onnxruntime", threads, early_exit=False)
        for _ in range(5):
            runner.run(x, None)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            runner.run(x, None)
            times.append((time.perf_counter() - t0) * 1e3)
        q = np.percentile(times, [10, 50, 90])
        out["variants"][variant.arch_id] = {"p10_ms": float(q[0]), "p50_ms": float(q[1]), "p90_ms": float(q[2]),
                                            "mean_ms": float(np.mean(times)), "runs": repeats}
    return out


# --------------------------------------------------------------------------- on the host


@functools.cache
def _shipped_supernet() -> tuple[Any, Any]:
    """The shipped supernet and its block costs, loaded once for every prediction of the run."""
    from hmt.pareto.objectives import measure_block_costs
    from hmt.supernet import load_supernet

    loaded = load_supernet(REPO / EMBEDDED_SUPERNET)
    return loaded, measure_block_costs(loaded.net)


def predict(profile_dir: Path, arch_ids: list[str], composition: bool = True) -> dict[str, float]:
    """Latency of each variant as pareto predicts it from ``profile_dir`` (same cost model and predictor);
    ``composition=False``: the raw block-table sum, without the profile's composition correction."""
    from hmt.pareto.objectives import ProfilePredictor, VariantCostModel
    from hmt.precision import split_variant_id
    from hmt.profile import load_profile

    loaded, blocks = _shipped_supernet()
    predictor = ProfilePredictor(load_profile(profile_dir), blocks, loaded.space)
    if not composition:
        predictor.predictor.composition = None  # the raw block-table sum
    model = VariantCostModel(loaded.net, blocks, predictor)
    return {a: model.costs(loaded.space.parse(split_variant_id(a)[0])).latency_ms for a in arch_ids}


def _errors(measured: dict[str, float], predicted: dict[str, float]) -> dict[str, Any]:
    rel = {a: (predicted[a] - measured[a]) / measured[a] for a in measured}
    within = [abs(r) <= TOLERANCE for r in rel.values()]
    return {"share_within_15pct": round(sum(within) / len(within), 4),
            "mape": round(statistics.fmean(abs(r) for r in rel.values()), 4),
            "relative_error": {a: round(r, 4) for a, r in rel.items()}}


def _profile_threads(profile: Path) -> tuple[int, dict[str, float] | None]:
    """The ONNX Runtime thread count a profile was measured with (what deploy gave its bundle), and the
    timings profile-device chose it from (None where it was given)."""
    device = json.loads((profile / "profile.json").read_text())["device"]
    return int(device["threads"]) or 1, device.get("threads_measured_ms")


def _profile_in_class(name: str, out: Path, args: argparse.Namespace, threads: int | None = None) -> float:
    threads = threads or THREADS.get(name)  # None: profile-device measures the count
    # --calibrate-variants K > 0: the composition correction of the block-table sum, fitted on K random
    # variants timed end to end inside the class (not the bundle's). Off by default: fitted on the bimodal
    # end-to-end medians of a class the pacer did not hold, it made every prediction worse
    # (results/class_measured_composition.json); the raw sum is reported beside it either way.
    return _hmt(["profile-device", "--quick", "--supernet", str(REPO / EMBEDDED_SUPERNET), "--no-load-model",
                 "--calibrate-variants", str(args.calibrate_variants),
                 *(["--threads", str(threads)] if threads else []),
                 "--seed", str(args.seed), "--out", str(out), "--force"],
                device_class=name)


def build_class(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    supernet = str(REPO / EMBEDDED_SUPERNET)
    p = {k: work / f"{k}-{name}" for k in ("profile", "pareto", "converted", "fused", "bundle")}
    wall: dict[str, float] = {}
    if not (p["profile"] / "manifest.json").is_file():
        _log(f"{name}: profile-device inside the class")
        wall["profile_device_s"] = _profile_in_class(name, p["profile"], args)
    if not (p["bundle"] / "manifest.json").is_file():
        _log(f"{name}: pareto, convert, fuse, deploy on the host")
        wall["pareto_s"] = _hmt(["pareto", "--supernet", supernet, "--profile", str(p["profile"]), "--data",
                                 str(REPO / "hmt/data/embedded"), "--evaluations", str(args.evaluations),
                                 "--population", "8", "--max-eval-samples", "300", "--calibration-samples", "256",
                                 "--threads", "1", "--seed", str(args.seed), "--out", str(p["pareto"]), "--force"])
        wall["convert_s"] = _hmt(["convert", "--supernet", supernet, "--pareto", str(p["pareto"]), "--max-variants",
                                  str(args.variants), "--min-accuracy", "60", "--out", str(p["converted"]), "--force"])
        wall["fuse_s"] = _hmt(["fuse", str(p["converted"]), "--engine", "ort", "--out", str(p["fused"]), "--force"])
        wall["deploy_s"] = _hmt(["deploy", "--fused", str(p["fused"]), "--pareto", str(p["pareto"]), "--target",
                                 "x86-64", "--engine", "onnxruntime", "--profile", str(p["profile"]), "--out",
                                 str(p["bundle"]), "--force"])
    return {"paths": p, "wall_s": {k: round(v, 1) for k, v in wall.items()}}


def _measure_in_class(name: str, bundle_dir: Path, out_json: Path, args: argparse.Namespace,
                      threads: int) -> dict[str, Any]:
    delivered: dict[str, Any] = {}
    done = run_in_class(CLASSES[name], [sys.executable, "-m", "benchmarks.device.class_measured", "measure",
                                        str(bundle_dir), "--threads", str(threads), "--repeats",
                                        str(args.repeats), "--out", str(out_json)],
                        cwd=REPO, env=_env(), stderr=subprocess.PIPE, timeout_s=3600, delivered=delivered)
    if done.returncode != 0:
        raise RuntimeError(f"measuring inside {name} failed: {done.stderr.decode()[-1500:]}")
    doc: dict[str, Any] = json.loads(out_json.read_text())
    doc["pacer"] = delivered
    return doc


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def bench_class(name: str, work: Path, host_profile: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``args.reps`` repetitions, each: a fresh profile inside the class (the first is the one the bundle
    was built from), its predictions for the bundle's variants, the variants measured inside the class,
    and (unless --no-scenario) the serve scenario there. Per variant: medians over repetitions."""
    from hmt.bundle import load_bundle

    built = build_class(name, work, args)
    bundle_dir = built["paths"]["bundle"]
    threads, threads_measured_ms = _profile_threads(built["paths"]["profile"])
    bundle = load_bundle(bundle_dir)
    arch_ids = [v.arch_id for v in bundle.spec.variants]
    bundle_predicted = {v.arch_id: float(v.latency_ms) for v in bundle.spec.variants}
    host = predict(host_profile, arch_ids)
    reps: list[dict[str, Any]] = []
    for rep in range(args.reps):
        profile = built["paths"]["profile"] if rep == 0 else work / f"profile-{name}-rep{rep}"
        if not (profile / "manifest.json").is_file():
            _log(f"{name}: profile-device inside the class (repetition {rep + 1})")
            _profile_in_class(name, profile, args, threads)
        predicted = predict(profile, arch_ids)
        raw = predict(profile, arch_ids, composition=False)
        _log(f"{name}: timing {len(arch_ids)} bundle variants inside the class (repetition {rep + 1})")
        doc = _measure_in_class(name, bundle_dir, work / f"measured-{name}-rep{rep}.json", args, threads)
        measured = {a: v["p50_ms"] for a, v in doc["variants"].items()}
        one: dict[str, Any] = {"predicted_ms": predicted, "measured": doc["variants"], "pacer": doc["pacer"],
                               "raw_predicted_ms": raw, "class_profile": _errors(measured, predicted),
                               "class_profile_raw_sum": _errors(measured, raw),
                               "host_profile_baseline": _errors(measured, host)}
        if args.scenario:
            one["serve"] = serve_in_class(name, bundle_dir, work / f"serve-{name}-rep{rep}", args, threads)
        reps.append(one)
    order = sorted(arch_ids, key=lambda a: bundle_predicted[a])
    med_pred = {a: _median([r["predicted_ms"][a] for r in reps]) for a in arch_ids}
    med_meas = {a: _median([r["measured"][a]["p50_ms"] for r in reps]) for a in arch_ids}
    med_raw = {a: _median([r["raw_predicted_ms"][a] for r in reps]) for a in arch_ids}
    # The mean time per call: what every call takes on a board of the class's speed. A call shorter than a
    # few pacer cycles mostly runs between stalls, so its per-call p50 misses them (the block table's
    # sustained times pay them, as a board would on every call).
    med_mean = {a: _median([r["measured"][a]["mean_ms"] for r in reps]) for a in arch_ids}
    result: dict[str, Any] = {
        "class": CLASSES[name].describe(), "threads": threads,
        "threads_how": "given (--threads)" if name in THREADS else "measured by profile-device inside the class",
        "threads_measured_ms": threads_measured_ms, "wall_s": built["wall_s"],
        "repetitions": args.reps, "repeats_per_measurement": args.repeats,
        "variants": [{"arch_id": a, "predicted_ms": round(med_pred[a], 3), "measured_p50_ms": round(med_meas[a], 3),
                      "measured_p10_ms": round(_median([r["measured"][a]["p10_ms"] for r in reps]), 3),
                      "measured_p90_ms": round(_median([r["measured"][a]["p90_ms"] for r in reps]), 3),
                      "measured_mean_ms": round(med_mean[a], 3),
                      "raw_sum_predicted_ms": round(med_raw[a], 3),
                      "bundle_predicted_ms": round(bundle_predicted[a], 3),
                      "host_profile_predicted_ms": round(host[a], 3)} for a in order],
        "class_profile": _errors(med_meas, med_pred),
        "class_profile_raw_sum": _errors(med_meas, med_raw),
        "class_profile_vs_mean": _errors(med_mean, med_pred),
        "host_profile_baseline": _errors(med_meas, host),
        "per_repetition": [{"class_profile_share_within_15pct": r["class_profile"]["share_within_15pct"],
                            "class_profile_mape": r["class_profile"]["mape"],
                            "class_profile_raw_sum_share_within_15pct":
                                r["class_profile_raw_sum"]["share_within_15pct"],
                            "host_profile_share_within_15pct": r["host_profile_baseline"]["share_within_15pct"],
                            "pacer": r["pacer"], **({"serve": r["serve"]} if "serve" in r else {})} for r in reps],
    }
    if args.scenario:
        result["serve"] = _serve_medians([r["serve"] for r in reps])
    return result


def _serve_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions of each mode's deadline-miss share and accuracy (each run's mean)."""
    modes = ("adaptive", "static_largest", "static_smallest")

    def med(key: str, mode: str) -> float | None:
        got = [(r[key][mode] or {}).get("mean") for r in runs]
        vals = [float(g) for g in got if g is not None]
        return round(_median(vals), 4) if vals else None

    return {"budget_ms": [r["budget_ms"] for r in runs], "rate_hz": runs[0]["rate_hz"], "phase_s": runs[0]["phase_s"],
            "repetitions": len(runs),
            "deadline_miss_share": {m: med("deadline_miss_share", m) for m in modes},
            "accuracy": {m: med("accuracy", m) for m in modes}}


def _quota_setting(device_class: DeviceClass) -> list[str]:
    """The class's budget told to serve where no kernel quota holds it: a paced class's cores read a
    quarter busy when the class's own processes use all of its budget (the pacer stops them), where a
    board's core reads full; serve reads its cgroup's CPU time over the budget instead."""
    if device_class.mechanism != "pacer":
        return []
    return ["--serve-json", json.dumps({"cpu_quota_cores": device_class.cpu_budget})]


def serve_in_class(name: str, bundle_dir: Path, work: Path, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    out = work / f"serve-{name}"
    _log(f"{name}: the serve scenario inside the class")
    done = run_in_class(CLASSES[name], [sys.executable, "-m", "benchmarks.serve.scenario", "--bundle",
                                        str(bundle_dir), "--out", str(out), "--engines",
                                        f"onnxruntime@{threads}", "--load-s", "0", "--phase-s",
                                        str(args.phase_s), "--reps", str(args.scenario_reps), "--clients", "2",
                                        "--rate-hz", str(RATE_HZ[name]), "--samples", "500",
                                        *_quota_setting(CLASSES[name])],
                        cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout_s=3600)
    if done.returncode != 0:
        raise RuntimeError(f"serve scenario inside {name} failed: {child_error(done.stderr.decode())}")
    report = json.loads((out / "results.json").read_text())
    engine = next(iter(report["engines"].values()))
    mean = engine["scenario"]["mean"]

    def miss(mode: str) -> Any:
        return (mean.get(mode) or {}).get("deadline_miss_share")

    def acc(mode: str) -> Any:
        return (mean.get(mode) or {}).get("accuracy")

    return {"budget_ms": round(engine["budget_ms"], 3), "rate_hz": RATE_HZ[name], "phase_s": args.phase_s,
            "repetitions": args.scenario_reps,
            "deadline_miss_share": {m: miss(m) for m in ("adaptive", "static_largest", "static_smallest")},
            "accuracy": {m: acc(m) for m in ("adaptive", "static_largest", "static_smallest")},
            "switches_adaptive": (mean.get("adaptive") or {}).get("switches"),
            # what the busy phases were sized to inside the class (the burners' capacity)
            "burn": next((r.get("burn") for r in engine["scenario"]["runs"].get("adaptive", []) if r.get("burn")),
                         None)}


def _pacer_held(name: str, delivered: dict[str, Any]) -> bool:
    """The class got its budget while it was timed (a busy class gets all of it): at least 95 % of it,
    read on exact clocks. A pacer reading tick-stale clocks lets the class run late and owe for ms."""
    budget = CLASSES[name].cpu_budget
    return bool(delivered.get("exact_cpu_clock")) and delivered.get("delivered_cpu_s_per_s", 0.0) >= 0.95 * budget


def _claims_of(per_class: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for name, r in per_class.items():
        c, h, raw = r["class_profile"], r["host_profile_baseline"], r.get("class_profile_raw_sum")
        claims.append({"claim": f"{name}: the class's measured profile predicts the bundle variants' p50 measured "
                                f"inside the class ({len(r['variants'])} variants, medians of {r['repetitions']} "
                                "repetitions; target >= 90 % within 15 %)",
                       "figure": f"{c['share_within_15pct']:.0%} within 15 %, MAPE {c['mape']:.1%} (host profile: "
                                 f"{h['share_within_15pct']:.0%}, MAPE {h['mape']:.1%}"
                                 + (f"; the class profile's raw block-table sum, without its composition correction: "
                                    f"{raw['share_within_15pct']:.0%}, MAPE {raw['mape']:.1%}" if raw else "") + ")"})
        mean = r.get("class_profile_vs_mean")
        if mean:
            claims.append({"claim": f"{name}: the same predictions against each variant's mean time per call inside "
                                    "the class (every call at the class's speed, as on a board; the p50 of calls "
                                    "shorter than a few pacer cycles misses the stalls between them)",
                           "figure": f"{mean['share_within_15pct']:.0%} within 15 %, MAPE {mean['mape']:.1%}"})
        pacers = [rep["pacer"] for rep in r["per_repetition"]]
        held = sum(_pacer_held(name, p) for p in pacers)
        delivered = ", ".join(f"{p.get('delivered_cpu_s_per_s', 0.0):.3f}" for p in pacers)
        budget = CLASSES[name].cpu_budget
        claims.append({"claim": f"{name}: the pacer kept the class's CPU budget ({budget:.2f} CPU s/s) while the "
                                "bundle's variants were timed inside it",
                       "figure": f"held in {held} of {len(pacers)} repetitions (delivered {delivered} CPU s/s; "
                                 f"exact CPU clocks: {sum(bool(p.get('exact_cpu_clock')) for p in pacers)})"})
        serve = r.get("serve")
        if serve:
            m = serve["deadline_miss_share"]
            budgets = ", ".join(f"{b:.1f}" for b in serve["budget_ms"])
            claims.append({"claim": f"{name}: serve's adaptive loop under the scenario's busy phases, deadline misses "
                                    f"against static largest (median of {serve['repetitions']} repetitions; "
                                    f"budgets {budgets} ms)",
                           "figure": f"{m['adaptive']:.1%} vs {m['static_largest']:.1%} (static smallest "
                                     f"{m['static_smallest']:.1%})"})
    return claims


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["measure"]:
        parser = argparse.ArgumentParser(prog="class_measured measure")
        parser.add_argument("bundle", type=Path)
        parser.add_argument("--threads", type=int, required=True)
        parser.add_argument("--repeats", type=int, default=50)
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("--seed", type=int, default=SEED)
        ns = parser.parse_args(argv[1:])
        ns.out.write_text(json.dumps(measure_bundle(ns.bundle, ns.threads, ns.repeats, ns.seed)) + "\n")
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="check the classes only (a busy loop in each)")
    parser.add_argument("--classes", default="rpi4-class,nano-class")
    parser.add_argument("--work", type=Path, default=None, help="keep (and reuse) the artifacts here")
    parser.add_argument("--host-profile", type=Path, default=None,
                        help="the host's profile (default: profiled here, unthrottled, with the same options)")
    parser.add_argument("--variants", type=int, default=6)
    parser.add_argument("--evaluations", type=int, default=16,
                        help="pareto's accuracy evaluations (on 300 embedded test images; accuracy is not the point)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--calibrate-variants", type=int, default=0,
                        help="random variants profile-device times end to end inside the class to fit its "
                             "composition correction (0, the default: the raw block-table sum)")
    parser.add_argument("--cycle-us", type=int, default=None,
                        help="the pacer's cycle for every class it paces (default: the pacer's, "
                             f"{CYCLE_US} us): a call spanning few cycles runs part of them at full speed")
    parser.add_argument("--threads", action="append", default=[], metavar="CLASS=N",
                        help="engine threads in a class: profiled, measured and served with (default: "
                             "profile-device measures the count inside the class)")
    parser.add_argument("--no-scenario", dest="scenario", action="store_false")
    parser.add_argument("--phase-s", type=float, default=3.0)
    parser.add_argument("--scenario-reps", type=int, default=1, help="scenario repetitions within each repetition")
    parser.add_argument("--reps", type=int, default=3,
                        help="repetitions: a fresh profile inside the class, the variants measured, the scenario")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--note", default="", help="said next to the machine in the result (who else was running)")
    args = parser.parse_args(argv)
    if args.calibrate_variants < 0:
        parser.error(f"--calibrate-variants: expected 0 or more variants, got {args.calibrate_variants}")
    for item in args.threads:
        name, _, count = item.partition("=")
        if name not in CLASSES or not count.isdigit() or int(count) < 1:
            parser.error(f"--threads {item!r}: expected CLASS=N with CLASS one of {sorted(CLASSES)} and N >= 1")
        THREADS[name] = int(count)
    if args.cycle_us is not None:
        if not 100 <= args.cycle_us <= 100_000:
            parser.error(f"--cycle-us {args.cycle_us}: expected 100 to 100000 us")
        for name, device_class in list(CLASSES.items()):
            if device_class.mechanism == "pacer":
                CLASSES[name] = replace(device_class, period_override_us=args.cycle_us)
    typed = shlex.join(["python", "-m", "benchmarks.device.class_measured", *argv])
    out = args.out or (Path(tempfile.mkdtemp(prefix="hmt-bench-class-")) / "class_measured.json" if args.quick
                       else RESULTS / "class_measured.json")
    names = [n.strip() for n in args.classes.split(",") if n.strip()]
    unknown = [n for n in names if n not in CLASSES]
    if unknown:
        parser.error(f"unknown class(es) {unknown}; known: {sorted(CLASSES)}")
    # Who else was running is the caller's to say (--note); without it, the shared VM's usual state.
    info = {**machine(), "note": (args.note or "shared machine (other developers' jobs running)")
            + "; each class has a high CPU weight so it receives its quota"}
    try:
        cgroup = f"cgroup v{layout().version}"
        if os.geteuid() != 0:
            raise CgroupUnavailable("writing cgroups needs root")
    except CgroupUnavailable as exc:
        print(f"class_measured: device classes unavailable here: {exc}", file=sys.stderr)
        if not args.quick:
            return 7
        write_result(out, make_result(area="device", name=out.stem, command=typed, seed=args.seed,
                                      baseline=BENCH.baseline, results={"skipped": str(exc)}, claims=[],
                                      machine_info=info))
        return 0
    shares = {n: round(cpu_seconds_per_second(CLASSES[n]), 3) for n in names}
    checks = {n: {"class": CLASSES[n].describe(), "budget_cpu_s_per_s": CLASSES[n].cpu_budget,
                  "busy_loop_cpu_s_per_s": shares[n]} for n in names}
    claims = [{"claim": f"{n}: CPU time a busy loop inside the class gets, against the class's budget ({cgroup})",
               "figure": f"{shares[n]:.2f} CPU s/s (budget {CLASSES[n].cpu_budget:.2f})"} for n in names]
    results: dict[str, Any] = {"cgroup": cgroup, "class_checks": checks}
    if not args.quick:
        work_ctx = None if args.work else tempfile.TemporaryDirectory(prefix="hmt-class-")
        work = args.work or Path(work_ctx.name)  # type: ignore[union-attr]
        work.mkdir(parents=True, exist_ok=True)
        try:
            host_profile = args.host_profile or work / "profile-host"
            if not (host_profile / "manifest.json").is_file():
                _log("host profile (unthrottled), the baseline's")
                _hmt(["profile-device", "--quick", "--supernet", str(REPO / EMBEDDED_SUPERNET), "--no-load-model",
                      "--seed", str(args.seed), "--out", str(host_profile), "--force"])
            per_class = {n: bench_class(n, work, host_profile, args) for n in names}
        finally:
            if work_ctx is not None:
                work_ctx.cleanup()
        results["classes"] = per_class
        claims += _claims_of(per_class)
    doc = make_result(area="device", name=out.stem, command=typed, seed=args.seed, baseline=BENCH.baseline,
                      results=results, claims=claims, machine_info=info)
    write_result(out, doc)
    for claim in claims:
        print(f"{claim['claim']}: {claim['figure']}")
    return 0


if __name__ == "__main__":
    with terminate_as_exit():  # killed, it still removes its class: no process left stopped, no cgroup left
        sys.exit(main())
