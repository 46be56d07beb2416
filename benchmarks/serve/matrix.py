"""The scenario matrix of issue 28: the adaptive loop against the oracle by bundle, engine and load shape.

For each bundle (``--bundle``, repeatable: the demo bundle and a second one with other variants),
each engine (``--engines``) and each load shape (``--shapes``, see :mod:`benchmarks.serve.oracle`:
one and two CPU burners, a real memory squeeze, Poisson and on/off bursty arrivals, a step of the
budget), the scenario is replayed once per variant served alone and once adaptively, ``--reps``
times; per phase the adaptive run's misses and table accuracy beside the oracle's and the static
largest's, its switches (those in steady phases: more than 1 s after a step), the first clean
0.5 s window after each step and the decision time; medians over the repetitions.

    PYTHONPATH=$PWD python -m benchmarks.serve matrix --bundle runs/demo/bundle-x86-64 \\
        --bundle runs/wide/bundle-x86-64 --engines onnxruntime,tvm --phase-s 3 --reps 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver
from benchmarks.serve.oracle import _claims, _summarise, add_arguments, bundle_facts, parse_shapes, run_engine
from benchmarks.serve.replay_common import export_cifar, machine_details, synthetic_bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, action="append", default=[])
    add_arguments(parser)
    args = parser.parse_args()
    shapes = parse_shapes(parser, args.shapes)
    recorded = {k: ([p.name for p in v] if k == "bundle" else str(v)) for k, v in vars(args).items() if k != "out"}
    report: dict[str, Any] = {"args": recorded, "machine_details": machine_details(), "bundles": {}}
    started = time.monotonic()

    def save() -> None:  # partial results survive
        report["wall_s"] = time.monotonic() - started
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    with tempfile.TemporaryDirectory(prefix="hmt-matrix-") as tmp:
        work = Path(tmp)
        if args.synthetic:
            bundles, data = [synthetic_bundle(work / "synthetic")], None
        elif not args.bundle:
            parser.error("--bundle (repeatable) or --synthetic")
        else:
            bundles, data = args.bundle, export_cifar(work / "cifar.npz", args.samples)
        for bundle_path in bundles:
            # A bundle by its folder's parent and name (no path of this machine in the report).
            name = bundle_path.name if args.synthetic else f"{bundle_path.parent.name}/{bundle_path.name}"
            _, variants, cut = bundle_facts(bundle_path)
            entry: dict[str, Any] = {"bundle": name, "variants": variants, "memory_cut_mb": cut, "engines": {}}
            report["bundles"][name] = entry
            for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
                entry["engines"][engine] = {}
                run_engine(bundle_path, data, engine, shapes, args, entry["engines"][engine], save)
    save()


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    return {"args": report.get("args"), "wall_s": report.get("wall_s"),
            "bundles": {name: _summarise(entry) for name, entry in report.get("bundles", {}).items()}}


def _all_claims(report: dict[str, Any]) -> list[dict[str, str]]:
    claims = []
    for name, entry in report.get("bundles", {}).items():
        for claim in _claims(entry):
            claims.append({"claim": f"{name}: {claim['claim']}", "figure": claim["figure"]})
    return claims


BENCH = Driver(
    baseline="every bundled variant served alone (static) over the same scenario in the same run: the oracle "
             "per phase and the static largest",
    quick=["--synthetic", "--shapes", "squeeze", "--phase-s", "1.0", "--reps", "1", "--squeeze-headroom-mb", "256",
           "--out", "{report}"],
    needs="the demo bundle and a second bundle, given with --bundle",
    summarise=_summary,
    claims=_all_claims,
)


if __name__ == "__main__":
    main()
