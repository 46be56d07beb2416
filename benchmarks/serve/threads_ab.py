"""serve's share of the CPU against fuse's thread counts as measured, on the demo's replay.

fuse times each variant alone on an idle machine and may choose ORT's default thread count (one
per core, spinning). serve runs ``--workers`` requests at once beside the device's own work, so by
default it cuts each variant's threads to its share (the cores it may use / the requests it runs
at once; :func:`hmt.runtime.variant.within_share`). This driver replays the demo's scenario
(``scripts/demo_scenario.csv``: idle, half of the CPU busy (one burner process flat out on this
2-core host), the same with the memory budget cut to 2 MB (below the largest variant), idle again; CIFAR-10 test
images through the HTTP API, 4 clients at 100 requests/s) with ``--compare`` (every variant
alone, then the adaptive loop) in two arms, alternated repetition by repetition in one run:
``share`` (serve's default) and ``fuse`` (fuse's threads uncut,
``SessionOptions.share_threads=False``). Per arm and phase it reports the medians over the
repetitions of the adaptive run, its oracle and the static largest (the oracle's definition:
:mod:`hmt.serve.reporting.oracle`).

    PYTHONPATH=$PWD python -m benchmarks.serve.threads_ab --bundle runs/demo/bundle-x86-64 --out ab.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver
from benchmarks.serve.oracle import _line, aggregate, steady_switches
from benchmarks.serve.replay_common import export_cifar, machine_details
from hmt.serve.http.api import ApiOptions
from hmt.serve.http.server import ServerOptions
from hmt.serve.running.compare import replay_compare
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import SessionOptions

ARMS = {"share": True, "fuse": False}


def run_rep(bundle: Path, scenario: Scenario, data: Path, args: argparse.Namespace, rep: int,
            share: bool) -> dict[str, Any]:
    """One --compare replay of ``scenario`` with serve's thread share on or off."""
    drive = DriveOptions(duration_s=scenario.end_s, clients=args.clients, rate_hz=args.rate_hz, load_mode="burn",
                         seed=rep)
    comparison = replay_compare(bundle, scenario, SessionOptions(share_threads=share), drive,
                                api=ApiOptions(workers=args.workers), server=ServerOptions(port=0), data=data,
                                seed=rep)
    bounds = [(p["start_s"], p["stop_s"]) for p in comparison.phases]
    static = {name: run.summary["deadline_miss_share"] for name, run in comparison.runs.items()}
    return {"phases": comparison.phases, "summary": comparison.summary(), "static_miss_share": static,
            "steady_switches": steady_switches(comparison.runs["adaptive"].ticks, bounds, 1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--scenario", type=Path, default=Path("scripts/demo_scenario.csv"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rate-hz", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2000, help="CIFAR-10 test images to cycle through")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    recorded = {k: (v.name if isinstance(v, Path) else str(v)) for k, v in vars(args).items() if k != "out"}
    report: dict[str, Any] = {"args": recorded, "machine_details": machine_details(),
                              "arms": {arm: [] for arm in ARMS}}
    scenario = Scenario.from_csv(args.scenario)
    started = time.monotonic()

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="hmt-threads-") as tmp:
        data = export_cifar(Path(tmp) / "cifar.npz", args.samples)
        for rep in range(args.reps):
            for arm, share in ARMS.items():
                doc = run_rep(args.bundle, scenario, data, args, rep, share)
                report["arms"][arm].append(doc)
                print(f"{arm} rep {rep}: {_line(doc['phases'])}", flush=True)
                save()
    report["median"] = {arm: aggregate(reps) for arm, reps in report["arms"].items()}
    report["wall_s"] = time.monotonic() - started
    save()


def _summarise(report: dict[str, Any]) -> dict[str, Any]:
    return {"args": report.get("args"), "wall_s": report.get("wall_s"), "median": report.get("median"),
            "static_miss_share": {arm: [r["static_miss_share"] for r in reps]
                                  for arm, reps in report.get("arms", {}).items()},
            "adaptive_miss_share": {arm: [r["summary"]["adaptive"]["miss_share"] for r in reps]
                                    for arm, reps in report.get("arms", {}).items()},
            "phases_tracked": {arm: [r["summary"]["phases_tracked"] for r in reps]
                               for arm, reps in report.get("arms", {}).items()}}


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for arm, reps in report.get("arms", {}).items():
        if not reps:
            continue
        adaptive = sorted(r["summary"]["adaptive"]["miss_share"] or 0.0 for r in reps)
        largest = sorted(r["summary"]["static_largest"]["miss_share"] or 0.0 for r in reps)
        tracked = [r["summary"]["phases_tracked"] for r in reps]
        claims.append({"claim": f"{arm}: the demo replay's misses, adaptive and static largest (median of "
                                f"{len(reps)} repetitions, range), and the phases where the adaptive run "
                                "tracks the oracle per repetition",
                       "figure": f"{100 * adaptive[len(adaptive) // 2]:.1f}% ({100 * adaptive[0]:.1f}-"
                                 f"{100 * adaptive[-1]:.1f}); {100 * largest[len(largest) // 2]:.1f}% "
                                 f"({100 * largest[0]:.1f}-{100 * largest[-1]:.1f}); {tracked} of "
                                 f"{len(reps[0]['phases'])}"})
    return claims


BENCH = Driver(
    baseline="fuse's per-variant thread counts uncut (the behaviour before serve's share), alternated with the "
             "share repetition by repetition in the same run; in each replay every variant served alone (the "
             "oracle per phase, the static largest)",
    quick=None,
    default=["--bundle", "runs/demo/bundle-x86-64", "--out", "{report}"],
    needs="the demo bundle (bash scripts/demo.sh)",
    summarise=_summarise,
    claims=_claims,
)


if __name__ == "__main__":
    main()
