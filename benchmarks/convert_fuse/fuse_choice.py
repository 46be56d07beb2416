"""Is fuse's engine choice the fastest candidate? Old fuse code against new, checked in a separate process.

Per repetition: ``fuse_model`` (ORT candidates) runs on ``--converted`` once with the old
code (``--old-code``: a tree holding the old ``hmt`` package, e.g. ``git archive <commit> hmt``)
and once with this tree's, each in its own process (the order alternates between
repetitions); then a third process rebuilds every candidate of every variant from the new
fused artifact (``hmt.fuse.runtime.load_fused_runner``, the same graphs and ORT settings fuse
timed; both codes build the same candidate set, checked) and times them all in one loop
written here, not fuse's: ``--rounds`` rounds, each a burst of ``--burst`` back-to-back calls
per candidate with the first ``--drop`` dropped, candidates in a rotated order per round
(as ``benchmarks/supernet/headline.py`` times). The figure per variant: the best candidate's median
over the median of each code's choice, in that one independent loop (>= 1.0: the choice was
the fastest; the spread over candidates tied within noise shows as ratios just under 1).

    python -m benchmarks.convert_fuse.fuse_choice --converted runs/r56-converted \\
        --old-code OLD_TREE --repetitions 3 --out runs/fuse_choice.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

ROOT = Path(__file__).resolve().parents[2]

FUSE_SNIPPET = """
import json, sys, time
from hmt.fuse import FuseOptions, fuse_model
t0 = time.perf_counter()
result = fuse_model(sys.argv[1], sys.argv[2], options=FuseOptions(engines=("ort",)))
wall = time.perf_counter() - t0
out = {"wall_s": round(wall, 2), "variants": {}}
for v in result.report["variants"]:
    out["variants"][v["name"]] = {"choice": v["choice"]["candidate"], "median_ms": v["choice"]["median_ms"],
                                  "candidates": sorted(v["candidates"])}
print(json.dumps(out))
"""


def _run_fuse(code_root: Path, converted: Path, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", FUSE_SNIPPET, str(converted), str(out)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"fuse under {code_root} failed:\n{proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["process_wall_s"] = round(time.perf_counter() - t0, 2)
    return doc


def independent(fused: Path, rounds: int, burst: int, drop: int) -> dict[str, Any]:
    """Every candidate of every variant of ``fused``, timed in this loop; medians of round medians (ms)."""
    from hmt.artifacts import load_artifact
    from hmt.fuse.runtime import load_fused_runner
    from hmt.graph.model import graph_inputs, load_onnx, seeded_inputs

    report = load_artifact(fused, kind="fused").read_json("report.json")
    out: dict[str, Any] = {}
    for entry in report["variants"]:
        name = entry["name"]
        first = entry["graphs"][[g["file"] for g in entry["graphs"]].index(entry["timed_path"][0])]
        feeds = seeded_inputs(graph_inputs(load_onnx(fused / first["onnx"]["file"])), seed=0)
        runners = {label: load_fused_runner(fused, name, feeds, candidate=label) for label in entry["candidates"]}
        for run in runners.values():
            for _ in range(3):
                run()
        labels = list(runners)
        medians: dict[str, list[float]] = {k: [] for k in labels}
        for r in range(rounds):
            for label in labels[r % len(labels):] + labels[: r % len(labels)]:
                run = runners[label]
                calls = []
                for i in range(burst):
                    t0 = time.perf_counter()
                    run()
                    if i >= drop:
                        calls.append((time.perf_counter() - t0) * 1e3)
                medians[label].append(statistics.median(calls))
        out[name] = {k: {"median_ms": round(statistics.median(v), 5), "round_medians_ms": [round(m, 5) for m in v]}
                     for k, v in medians.items()}
    return out


BENCH = Driver(
    baseline="the old code's choice, rebuilt and timed in the same independent loop",
    needs="a converted artifact and an old code tree (--converted, --old-code)",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--converted", type=Path)
    parser.add_argument("--old-code", type=Path)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--drop", type=int, default=4)
    parser.add_argument("--independent", type=Path, help=argparse.SUPPRESS)  # the timing child process
    parser.add_argument("--resummarise", action="store_true",
                        help="recompute the summary of an existing --out JSON from its stored rounds, no timing")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.resummarise:
        doc = json.loads(args.out.read_text())
        summarise(doc)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        return 0
    if args.independent is not None:
        args.out.write_text(json.dumps(independent(args.independent, args.rounds, args.burst, args.drop)))
        return 0
    if args.converted is None or args.old_code is None:
        parser.error("--converted and --old-code are required")
    doc: dict[str, Any] = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                       "processor": _cpu_model(), "load_avg_start": list(os.getloadavg())},
                           "command": "python3 " + " ".join(sys.argv),
                           "independent_timing": {"rounds": args.rounds, "burst": args.burst, "dropped": args.drop},
                           "repetitions": []}
    with tempfile.TemporaryDirectory(prefix="fuse-choice-") as tmp:
        for rep in range(args.repetitions):
            work = Path(tmp) / f"rep{rep}"
            codes = [("old", args.old_code), ("new", ROOT)]
            if rep % 2:
                codes.reverse()
            fuses = {label: _run_fuse(root, args.converted, work / f"fused-{label}") for label, root in codes}
            timing_json = work / "independent.json"
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            subprocess.run([sys.executable, __file__, "--independent", str(work / "fused-new"), "--rounds",
                            str(args.rounds), "--burst", str(args.burst), "--drop", str(args.drop),
                            "--out", str(timing_json)], env=env, check=True)
            timed = json.loads(timing_json.read_text())
            rows = {}
            for name, cands in timed.items():
                best_label = min(cands, key=lambda k: cands[k]["median_ms"])
                best = cands[best_label]["median_ms"]
                row: dict[str, Any] = {"best": best_label, "best_ms": best, "candidates": cands}
                for label in ("old", "new"):
                    choice = fuses[label]["variants"][name]["choice"]
                    if fuses[label]["variants"][name]["candidates"] != sorted(cands):
                        raise SystemExit(f"{name}: old and new fuse built different candidates")
                    row[label] = {"choice": choice, "fuse_median_ms": fuses[label]["variants"][name]["median_ms"],
                                  "independent_ms": cands[choice]["median_ms"],
                                  "best_over_choice": round(best / cands[choice]["median_ms"], 4)}
                rows[name] = row
                print(f"rep {rep} {name[-32:]}: best {best_label} {best:.4f}; "
                      f"old {row['old']['choice']} {row['old']['best_over_choice']:.3f}; "
                      f"new {row['new']['choice']} {row['new']['best_over_choice']:.3f}", file=sys.stderr)
            doc["repetitions"].append({"order": [c[0] for c in codes],
                                       "fuse_wall_s": {k: v["wall_s"] for k, v in fuses.items()},
                                       "variants": rows})
    summarise(doc)
    doc["machine"]["load_avg_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def within_check_noise(choice: list[float], best: list[float], floor: float = 0.02) -> bool:
    """Whether the choice is tied with the best in the check loop itself: the median of their
    round-by-round ratios within max(floor, half its inter-quartile range) of 1 (fuse's tie rule,
    applied to the independent loop's own rounds)."""
    ratios = sorted(c / b for c, b in zip(choice, best, strict=True))
    n = len(ratios) - 1
    noise = (ratios[int(0.75 * n + 0.5)] - ratios[int(0.25 * n + 0.5)]) / 2 if len(ratios) >= 4 else 0.0
    return statistics.median(ratios) <= 1 + max(floor, noise)


def summarise(doc: dict[str, Any]) -> None:
    """Per variant and code: best/choice ratios over the repetitions; counts over all rows."""
    summary: dict[str, Any] = {}
    tied: dict[str, list[bool]] = {"old": [], "new": []}
    for name in doc["repetitions"][0]["variants"]:
        summary[name] = {label: [r["variants"][name][label]["best_over_choice"] for r in doc["repetitions"]]
                         for label in ("old", "new")}
        for r in doc["repetitions"]:
            row = r["variants"][name]
            best = row["candidates"][row["best"]]["round_medians_ms"]
            for label in ("old", "new"):
                chosen = row["candidates"][row[label]["choice"]]["round_medians_ms"]
                tied[label].append(within_check_noise(chosen, best))
    doc["summary_best_over_choice"] = summary
    for label in ("old", "new"):
        ratios = [v for s in summary.values() for v in s[label]]
        doc[f"{label}_rows_at_least_1"] = sum(v >= 1.0 for v in ratios)
        doc[f"{label}_rows_at_least_0.98"] = sum(v >= 0.98 for v in ratios)
        doc[f"{label}_rows_tied_with_best_in_check_noise"] = sum(tied[label])
        doc[f"{label}_min_ratio"] = min(ratios)
        doc[f"{label}_median_ratio"] = statistics.median(ratios)
    doc["rows"] = len(summary) * len(doc["repetitions"])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
