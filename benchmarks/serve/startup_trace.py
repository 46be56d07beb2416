"""Why the loop leaves the largest variant in the matrix's idle first phase (issue 28): a trace.

Replays the matrix's scenarios (:mod:`benchmarks.serve.oracle`'s shapes: idle, the shape, idle)
adaptively only, the way ``matrix`` runs a repetition (client processes, the API, the same rate
and budget), and keeps, for each departure from the most accurate variant in the first phase,
the decisions that made it and the way back: time, reason, load index and forecast, serving
overhead, the active variant's estimate and where it came from (prior, scaled from another load
level, measured), and how long the largest stayed out of that idle phase.

    python -m benchmarks.serve startup_trace --bundle runs/demo/bundle-x86-64 --budget-ms 5 \\
        --shapes burn1,budget,poisson --reps 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver
from benchmarks.serve.oracle import BUDGET_STEP, bundle_facts, parse_shapes, shape_scenario
from benchmarks.serve.replay_common import REPLAY_API, export_cifar
from hmt.errors import HmtError
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import ServerOptions, SessionOptions, run_scenario

STARTUP_S = 0.6  # a departure this soon after serve started is a start-up one


def _tick(t: Any) -> dict[str, Any]:
    return {"time_s": round(t.time_s, 3), "trigger": t.trigger, "reason": t.switch_reason,
            "switched": t.switched, "active": t.active, "proposed": t.proposed,
            "load_index": round(t.load_index, 3), "load_forecast": round(t.load_forecast, 3),
            "overhead_ms": round(t.overhead_ms, 3), "active_estimate_ms": round(t.predicted_latency_ms, 3),
            "estimate_source": t.estimate_source}


def _first_phase(ticks: list[Any], largest: str, phase_s: float) -> dict[str, Any]:
    """The first phase's departures from ``largest``: the decisions up to each and back."""
    off_s, left_at, departures = 0.0, None, []
    for t in ticks:
        if t.time_s >= phase_s:
            break
        if t.switched and t.active != largest and left_at is None:
            left_at = t.time_s
            departures.append({"left_at_s": round(t.time_s, 3), "reason": t.switch_reason,
                               "ticks": [_tick(u) for u in ticks if t.time_s - 0.3 <= u.time_s <= t.time_s]})
        elif t.switched and t.active == largest and left_at is not None:
            off_s += t.time_s - left_at
            departures[-1]["back_at_s"] = round(t.time_s, 3)
            left_at = None
    if left_at is not None:
        off_s += phase_s - left_at
    return {"departures": departures, "largest_out_s": round(off_s, 3)}


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    runs = report["runs"]
    left = [r for r in runs if r["departures"]]
    sources: dict[str, int] = {}
    for r in left:
        for departure in r["departures"]:
            ticks = departure["ticks"]
            # The largest's estimate at the decision before the switch (the switching tick records
            # the variant switched to).
            before = ticks[-2] if len(ticks) >= 2 else ticks[-1]
            when = "start" if departure["left_at_s"] < STARTUP_S else "later"
            key = f"{when}/{before['estimate_source']}"
            sources[key] = sources.get(key, 0) + 1
    out = sorted(r["largest_out_s"] for r in runs)
    return [{"claim": "idle first phase of the matrix's scenarios: runs where the loop left the largest variant; "
                      f"departures by when (within {STARTUP_S:g} s of the start or later) and where the largest's "
                      "estimate came from at the decision before; seconds the largest stayed out of the "
                      f"{report['phase_s']:g} s phase (median, max)",
             "figure": f"{len(left)} of {len(runs)}; {json.dumps(sources, sort_keys=True)}; "
                       f"{out[len(out) // 2]:.2f} s, {out[-1]:.2f} s"}]


BENCH = Driver(baseline="none: a trace of the adaptive run alone (the matrix holds the oracle and the static largest)",
               needs="a bundle (--bundle)", claims=_claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--engine", default="onnxruntime")
    parser.add_argument("--shapes", default="burn1,budget,poisson")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=3.0)
    parser.add_argument("--budget-ms", type=float, default=5.0)
    parser.add_argument("--rate-hz", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shapes = parse_shapes(parser, args.shapes)
    try:
        largest, _, memory_cut_mb = bundle_facts(args.bundle)
    except HmtError as exc:  # not a bundle: the usage error, no traceback
        parser.error(f"--bundle: {exc}")
    api = REPLAY_API
    runs = []
    with tempfile.TemporaryDirectory(prefix="hmt-startup-trace-") as tmp:
        data = export_cifar(Path(tmp) / "cifar.npz", args.samples)
        for shape in shapes:
            text, arrivals = shape_scenario(shape, args.phase_s, args.budget_ms, memory_cut_mb, BUDGET_STEP)
            for rep in range(args.reps):
                drive = DriveOptions(duration_s=3 * args.phase_s, clients=args.clients, rate_hz=args.rate_hz,
                                     load_mode="burn", arrivals=arrivals, seed=rep, client_mode="processes")
                result = run_scenario(args.bundle, Scenario.from_text(text), SessionOptions(engine=args.engine),
                                      drive, api=api, server=ServerOptions(port=0), data=data, label="adaptive")
                run = {"shape": shape, "rep": rep, **_first_phase(result.ticks, largest, args.phase_s)}
                runs.append(run)
                print(f"{shape} rep {rep}: left the largest {len(run['departures'])} time(s), "
                      f"out {run['largest_out_s']:.2f} s of the first {args.phase_s:g} s", flush=True)
    report = {"bundle": f"{args.bundle.parent.name}/{args.bundle.name}", "engine": args.engine,
              "largest": largest, "budget_ms": args.budget_ms, "phase_s": args.phase_s, "rate_hz": args.rate_hz,
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
