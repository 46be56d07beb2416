"""The adaptive loop against the best static choice in hindsight (issue 28), by engine and load shape.

Each load shape is a three-phase scenario, ``--phase-s`` each: quiet, the shape, quiet. For every
(engine, shape, repetition) the scenario is replayed once per bundled variant (static, ``serve
--variant``) and once adaptively, in the same run (:func:`hmt.serve.running.compare.replay_compare`);
per phase the oracle is the most accurate variant whose static run missed at most 5% of the phase's
deadlines (else the one with the fewest misses), and the adaptive run *tracks* it when its misses
are at most the oracle's plus 5 points and its table accuracy (the bundle's accuracy of the exit
that answered each request) at most 2 points below. The static largest is reported beside both.

Shapes (``--shapes``): ``burn1`` / ``burn2`` (a busy process on one / both cores), ``squeeze``
(real memory pressure: serve keeps all but ``--squeeze-headroom-mb`` of the machine's available
memory free, serve.json ``memory_reserve_mb``, and another process takes and touches twice that:
the free memory serve reads falls below its reserve), ``memory`` (the memory budget cut to the
smaller half of the variants), ``poisson`` / ``onoff`` (Poisson or on/off
bursty arrivals at the same mean rate for the whole run, one core busy in the middle phase),
``budget`` (the latency budget stepped to ``--budget-step`` x in the middle phase, no load).

The budget is ``--budget-factor`` x the largest variant's unloaded server-side p95, calibrated per
engine in the same run. Requests through the HTTP API; CIFAR-10 test images (or, ``--synthetic``,
a MatMul bundle and seeded noise: the quick path).

    PYTHONPATH=$PWD python -m benchmarks.serve.oracle --bundle runs/demo/bundle-x86-64 --out oracle.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver
from benchmarks.serve.replay_common import REPLAY_API, calibrate_ms, export_cifar, machine_details, synthetic_bundle
from hmt.bundle import load_bundle
from hmt.serve.http.server import ServerOptions
from hmt.serve.running.compare import replay_compare
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import SessionOptions

SHAPES = ("burn1", "burn2", "squeeze", "memory", "poisson", "onoff", "budget")
BUDGET_STEP = 0.6  # the budget shape's middle-phase factor (--budget-step)


def shape_scenario(shape: str, phase_s: float, budget_ms: float, memory_cut_mb: float,
                   budget_step: float, squeeze_mb: float = 2048.0) -> tuple[str, str]:
    """(scenario CSV text, arrivals) of one load shape: quiet, the shape, quiet."""
    p = phase_s
    middle = {"burn1": ("0.5", "", budget_ms, ""), "burn2": ("1.0", "", budget_ms, ""),
              "squeeze": ("", "", budget_ms, f"{squeeze_mb:g}"),
              "memory": ("", f"{memory_cut_mb:.4f}", budget_ms, ""), "poisson": ("0.5", "", budget_ms, ""),
              "onoff": ("0.5", "", budget_ms, ""), "budget": ("", "", budget_step * budget_ms, "")}[shape]
    cpu, memory, budget, squeeze = middle
    text = (f"time_s,cpu_load,memory_budget_mb,latency_budget_ms,memory_squeeze_mb\n0,,,{budget_ms:.4f},\n"
            f"{p:g},{cpu},{memory},{budget:.4f},{squeeze}\n{2 * p:g},,,{budget_ms:.4f},\n")
    arrivals = shape if shape in ("poisson", "onoff") else "constant"
    return text, arrivals


def _median(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def aggregate(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions: per phase (adaptive, oracle, static largest) and whole-run figures."""
    phases = []
    for k in range(len(reps[0]["phases"])):
        rows = [r["phases"][k] for r in reps]
        entry: dict[str, Any] = {"phase": k, "oracle_variants": [r["oracle_variant"] for r in rows],
                                 "tracked": sum(bool(r["tracks_oracle"]) for r in rows), "reps": len(rows)}
        for who in ("adaptive", "oracle", "static_largest"):
            entry[who] = {name: _median([r[who][name] for r in rows])
                          for name in ("miss_share", "table_accuracy", "accuracy")}
        entry["misses_within_slack"] = (entry["adaptive"]["miss_share"] is not None
                                        and entry["oracle"]["miss_share"] is not None
                                        and entry["adaptive"]["miss_share"] <= entry["oracle"]["miss_share"] + 0.05)
        entry["accuracy_within_slack"] = (entry["adaptive"]["table_accuracy"] is not None
                                          and entry["oracle"]["table_accuracy"] is not None
                                          and entry["adaptive"]["table_accuracy"]
                                          >= entry["oracle"]["table_accuracy"] - 0.02)
        phases.append(entry)
    return {"phases": phases,
            "switches_median": _median([r["summary"]["adaptive"]["switches"] for r in reps]),
            "switches_steady_phases_median": _median([r["steady_switches"] for r in reps]),
            "decision_us_p50_median": _median([(r["summary"]["adaptive"]["decision_us"] or {}).get("p50")
                                               for r in reps]),
            "first_clean_window_s_max_median": _median([r["summary"]["adaptive"]["first_clean_window_s_max"]
                                                        for r in reps]),
            "phases_tracked_by_median": sum(p["misses_within_slack"] and p["accuracy_within_slack"] for p in phases)}


def steady_switches(ticks: list[Any], bounds: list[tuple[float, float]], settle_s: float) -> int:
    """Switches later than ``settle_s`` into a phase (oscillation in a steady phase)."""
    return sum(1 for t in ticks if t.switched and any(a + settle_s <= t.time_s < b for a, b in bounds))


def switch_events(ticks: list[Any]) -> list[dict[str, Any]]:
    """The adaptive run's switches: when (scenario time), to which variant, why, and the memory
    budget the loop read then (the squeeze shape's way back is read off these)."""
    return [{"t_s": round(t.time_s, 3), "to": t.active, "reason": t.switch_reason,
             "memory_budget_mb": None if t.memory_budget_mb is None else round(t.memory_budget_mb, 1)}
            for t in ticks if t.switched]


def bundle_facts(bundle_path: Path) -> tuple[str, dict[str, Any], float]:
    """(the most accurate variant, each variant's table figures, the memory shape's budget cut)."""
    variants = sorted(load_bundle(bundle_path).spec.variants, key=lambda v: v.latency_ms)
    largest = max(variants, key=lambda v: v.accuracy).arch_id
    by_memory = sorted(v.memory_mb for v in variants)
    memory_cut_mb = by_memory[max(0, len(by_memory) // 2 - 1)] * 1.001
    return largest, {v.arch_id: {"accuracy": v.accuracy, "latency_ms_profile": v.latency_ms,
                                 "memory_mb": v.memory_mb} for v in variants}, memory_cut_mb


def run_engine(bundle_path: Path, data: Path | None, engine: str, shapes: list[str], args: argparse.Namespace,
               out: dict[str, Any], save: Any) -> None:
    """Every shape of ``shapes`` on ``engine``, ``args.reps`` times, into ``out`` (``save()`` after each)."""
    largest, _, memory_cut_mb = bundle_facts(bundle_path)
    overrides = json.loads(args.serve_json)
    api = REPLAY_API
    mode = "processes" if args.client_processes else "threads"
    idle_p95 = calibrate_ms(bundle_path, largest, data, engine=engine, rate_hz=args.rate_hz, clients=args.clients,
                            client_mode=mode)
    budget_ms = args.budget_ms if args.budget_ms is not None else args.budget_factor * idle_p95
    print(f"{engine}: budget {budget_ms:.3f} ms (largest idle p95 {idle_p95:.3f} ms)", flush=True)
    out.update({"budget_ms": budget_ms, "largest_idle_p95_ms": idle_p95, "shapes": {}})
    for shape in shapes:
        text, arrivals = shape_scenario(shape, args.phase_s, budget_ms, memory_cut_mb, args.budget_step,
                                        2.0 * args.squeeze_headroom_mb)
        scenario = Scenario.from_text(text)
        reps = []
        for rep in range(args.reps):
            drive = DriveOptions(duration_s=3 * args.phase_s, clients=args.clients, rate_hz=args.rate_hz,
                                 load_mode="burn", arrivals=arrivals, seed=rep, client_mode=mode)
            serve_json = dict(overrides)
            if shape == "squeeze":  # the loop keeps all but the headroom of what is available now free
                serve_json["memory_reserve_mb"] = max(0.0, available_mb() - args.squeeze_headroom_mb)
            options = SessionOptions(engine=engine, serve_overrides=serve_json)
            comparison = replay_compare(bundle_path, scenario, options, drive, api=api,
                                        server=ServerOptions(port=0), data=data, seed=rep, warmup_s=args.settle_s)
            adaptive = comparison.runs["adaptive"]
            bounds = [(p["start_s"], p["stop_s"]) for p in comparison.phases]
            doc: dict[str, Any] = {"phases": comparison.phases, "summary": comparison.summary(),
                                   "steady_switches": steady_switches(adaptive.ticks, bounds, 1.0),
                                   "switch_events": switch_events(adaptive.ticks)}
            reps.append(doc)
            print(f"{engine} {shape} rep {rep}: switches {doc['summary']['adaptive']['switches']} "
                  f"(steady {doc['steady_switches']}) {_line(comparison.phases)}", flush=True)
        out["shapes"][shape] = {"arrivals": arrivals, "scenario": text, "reps": reps, "median": aggregate(reps)}
        save()


def available_mb() -> float:
    """The machine's available memory now (what serve's monitor reads), MB."""
    import psutil

    return float(psutil.virtual_memory().available) / 1e6


def short(arch_id: str) -> str:
    """A variant's id, short enough for a console line: its exit and first genes."""
    parts = arch_id.split(".")
    return ".".join(parts[1:])[:10] if len(parts) > 1 else arch_id[-10:]


def _line(phases: list[dict[str, Any]]) -> str:
    return "  ".join(
        f"[{p['start_s']:g}s oracle {short(p['oracle_variant'])} "
        f"{100 * (p['oracle']['miss_share'] or 0):.1f}%/{100 * (p['oracle']['table_accuracy'] or 0):.1f} "
        f"adaptive {100 * (p['adaptive']['miss_share'] or 0):.1f}%/{100 * (p['adaptive']['table_accuracy'] or 0):.1f}"
        f" largest {100 * (p['static_largest']['miss_share'] or 0):.1f}% "
        f"{'ok' if p['tracks_oracle'] else 'MISS'}]" for p in phases)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options the oracle and matrix drivers share."""
    parser.add_argument("--synthetic", action="store_true", help="a synthetic MatMul bundle, seeded noise inputs")
    parser.add_argument("--engines", default="onnxruntime")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--phase-s", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate-hz", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--client-processes", action=argparse.BooleanOptionalAction, default=True,
                        help="each client in its own process (the default: a user's clients are other processes), "
                             "so the server's latency is not inflated by client threads sharing its interpreter; "
                             "--no-client-processes runs them as threads in the benchmark's process")
    parser.add_argument("--budget-factor", type=float, default=1.3)
    parser.add_argument("--budget-step", type=float, default=BUDGET_STEP, help="the budget shape's middle-phase factor")
    parser.add_argument("--budget-ms", type=float, default=None, help="a fixed budget instead of calibrating")
    parser.add_argument("--squeeze-headroom-mb", type=float, default=1024.0,
                        help="squeeze shape: serve keeps all but this much of the available memory free "
                             "(memory_reserve_mb); the squeeze takes twice this")
    parser.add_argument("--settle-s", type=float, default=0.0,
                        help="requests sent this soon after a step are left out of the phase's scores (the "
                             "step's reaction is judged by the first clean window instead)")
    parser.add_argument("--samples", type=int, default=2000, help="CIFAR-10 test images to cycle through")
    parser.add_argument("--serve-json", default="{}", help="serve.json overrides of every run (JSON)")
    parser.add_argument("--out", type=Path, required=True)


def parse_shapes(parser: argparse.ArgumentParser, text: str) -> list[str]:
    shapes = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; expected some of {list(SHAPES)}")
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=None)
    add_arguments(parser)
    args = parser.parse_args()
    shapes = parse_shapes(parser, args.shapes)
    # No path of this machine in the report: the bundle by its folder name, the output not at all.
    recorded = {k: (v.name if isinstance(v, Path) else str(v)) for k, v in vars(args).items() if k != "out"}
    report: dict[str, Any] = {"args": recorded, "machine_details": machine_details(), "engines": {}}
    started = time.monotonic()

    def save() -> None:  # partial results survive
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="hmt-oracle-") as tmp:
        work = Path(tmp)
        if args.synthetic:
            bundle_path, data = synthetic_bundle(work / "bundle"), None
        else:
            if args.bundle is None:
                parser.error("--bundle or --synthetic")
            bundle_path, data = args.bundle, export_cifar(work / "cifar.npz", args.samples)
        _, report["variants"], report["memory_cut_mb"] = bundle_facts(bundle_path)
        report["bundle"] = "synthetic" if args.synthetic else bundle_path.name
        for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
            report["engines"][engine] = {}
            run_engine(bundle_path, data, engine, shapes, args, report["engines"][engine], save)
    report["wall_s"] = time.monotonic() - started
    save()


def _summarise(report: dict[str, Any]) -> dict[str, Any]:
    """The result's ``results``: per engine and shape, the medians (not the repetitions)."""
    return {"bundle": report.get("bundle"), "variants": report.get("variants"), "args": report.get("args"),
            "wall_s": report.get("wall_s"),
            "engines": {e: {"budget_ms": v["budget_ms"], "largest_idle_p95_ms": v["largest_idle_p95_ms"],
                            "shapes": {s: {"arrivals": d["arrivals"], **d["median"]} for s, d in v["shapes"].items()}}
                        for e, v in report.get("engines", {}).items()}}


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for engine, v in report.get("engines", {}).items():
        for shape, d in v["shapes"].items():
            m = d["median"]
            busy = m["phases"][1]
            claims.append({
                "claim": f"{engine}, {shape}: phases where the adaptive run tracks the oracle (medians of "
                         f"{len(d['reps'])} repetitions); middle-phase misses and accuracy, adaptive / oracle / "
                         f"static largest; switches (in steady phases)",
                "figure": f"{m['phases_tracked_by_median']}/{len(m['phases'])}; "
                          f"{100 * (busy['adaptive']['miss_share'] or 0):.1f}% / "
                          f"{100 * (busy['oracle']['miss_share'] or 0):.1f}% / "
                          f"{100 * (busy['static_largest']['miss_share'] or 0):.1f}%; "
                          f"{100 * (busy['adaptive']['table_accuracy'] or 0):.1f}% / "
                          f"{100 * (busy['oracle']['table_accuracy'] or 0):.1f}% / "
                          f"{100 * (busy['static_largest']['table_accuracy'] or 0):.1f}%; "
                          f"{m['switches_median']:g} ({m['switches_steady_phases_median']:g})"})
    if claims:
        decision = [d["median"]["decision_us_p50_median"] for v in report["engines"].values()
                    for d in v["shapes"].values() if d["median"]["decision_us_p50_median"] is not None]
        clean = [d["median"]["first_clean_window_s_max_median"] for v in report["engines"].values()
                 for d in v["shapes"].values() if d["median"]["first_clean_window_s_max_median"] is not None]
        claims.append({"claim": "decision time p50 in the loop (median per shape) and the latest first clean 0.5 s "
                                "window after a step (median per shape), range over the shapes",
                       "figure": f"{min(decision):.1f}-{max(decision):.1f} us; {min(clean):.2f}-{max(clean):.2f} s"
                       if decision and clean else "-"})
    return claims


BENCH = Driver(
    baseline="every bundled variant served alone (static) over the same scenario in the same run: the oracle "
             "per phase and the static largest",
    quick=["--synthetic", "--shapes", "burn2", "--phase-s", "1.5", "--reps", "1", "--rate-hz", "40",
           "--out", "{report}"],
    default=["--bundle", "runs/demo/bundle-x86-64", "--out", "{report}"],
    needs="the demo bundle (bash scripts/demo.sh) for the default run",
    summarise=_summarise,
    claims=_claims,
)


if __name__ == "__main__":
    main()
