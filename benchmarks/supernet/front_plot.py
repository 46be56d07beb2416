"""Issue 11: the supernet's front against standalone networks, accuracy vs measured latency.

The front's non-dominated variants by (MACs, test accuracy) from ``bench_front.py``'s CSV,
and the standalone baselines (JSON files of ``bench_standalone.py``: accuracy; their plain
networks are built here), are each timed with ONNX Runtime (batch 1, ``--threads``) in
bursts alternating with the supernet's original network, so every latency is also a
ratio to the original measured in the same loop. Graphs come from untrained weights of
the same architectures (latency does not depend on weight values). Writes a JSON and a PNG.

    python -m benchmarks.supernet.front_plot --front benchmarks/supernet/results/r18_front.csv \\
        --standalone benchmarks/supernet/results/standalone_networks.json --out runs/front
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import Driver
from benchmarks.supernet.headline import _machine, _session, time_pair
from hmt.supernet.supernet import build_supernet
from hmt.supernet.train.config import resolve_config


def pareto_rows(rows: list[dict]) -> list[dict]:
    best = -1.0
    out = []
    for r in sorted(rows, key=lambda r: (r["macs"], -r["test_acc"])):
        if r["test_acc"] > best:
            out.append(r)
            best = r["test_acc"]
    return out


BENCH = Driver(
    baseline="the supernet's original network, timed in bursts alternating with every point",
    needs="a front CSV and standalone results (--front, --standalone)",
    report="{tmp}/front.json",
    out_args=("--out", "{tmp}/front"),
)


def standalone_rows(pattern: str) -> list[dict[str, Any]]:
    """Rows of ``standalone.py`` reports matched by ``pattern``; a harness result that merged
    several (``results/standalone_networks.json``: report name -> report) counts as all of them."""
    rows: list[dict[str, Any]] = []
    for path in sorted(glob.glob(pattern)) if pattern else []:
        results = json.loads(Path(path).read_text())["results"]
        reports = list(results.values()) if isinstance(results, dict) else [{"results": results}]
        for report in reports:
            rows += report["results"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--front", type=Path, required=True)
    parser.add_argument("--preset", default="cifar10")
    parser.add_argument("--supernet", type=Path, default=None,
                        help="a supernet artifact whose space the front is in (an elastified user model); "
                             "otherwise an untrained supernet of --preset")
    parser.add_argument("--standalone", default="", help="glob of standalone.py reports (or their harness result)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--drop", type=int, default=4)
    parser.add_argument("--max-points", type=int, default=12)
    parser.add_argument("--out", type=Path, required=True, help="prefix: writes OUT.json and OUT.png")
    args = parser.parse_args()
    if args.supernet is not None:
        from hmt.supernet import load_supernet

        net = load_supernet(args.supernet).net
    else:
        config = resolve_config(preset=args.preset)
        torch.manual_seed(0)
        net = build_supernet(config.backbone, num_classes=10, input_shape=(3, 32, 32), operators=config.operators)
        net.prepare_alternatives()
    rows = [dict(r, test_acc=float(r["test_acc"]), macs=int(r["macs"])) for r in csv.DictReader(args.front.open())]
    largest = net.space.largest().arch_id
    front = pareto_rows(rows)
    if len(front) > args.max_points:
        keep = np.linspace(0, len(front) - 1, args.max_points).round().astype(int)
        front = [front[i] for i in sorted(set(keep.tolist()))]
    points = [("supernet", r["arch_id"], r["test_acc"], net.materialize(net.space.parse(r["arch_id"]))) for r in front]
    for r in standalone_rows(args.standalone):
            sn = build_supernet(r["backbone"], num_classes=10, input_shape=(3, 32, 32), operators=())
            points.append((f"alone: {r['name']} ({r['epochs']} ep)", r["arch_id"], r["test_acc"],
                           sn.materialize(sn.space.largest())))
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        def session(module: torch.nn.Module, name: str):  # type: ignore[no-untyped-def]
            path = Path(tmp) / f"{name}.onnx"
            torch.onnx.export(module.eval(), (torch.from_numpy(x),), str(path), input_names=["x"], dynamo=False)
            return _session(path, args.threads)

        reference = session(net.materialize(net.space.largest()), "reference")
        for i, (kind, arch_id, acc, module) in enumerate(points):
            ref_ms, ms = time_pair(reference, session(module, str(i)), x, bursts=args.bursts, calls=args.burst,
                                   drop=args.drop)
            results.append({"kind": kind, "arch_id": arch_id, "test_acc": acc, "latency_ms": ms,
                            "original_latency_ms": ref_ms, "speedup_vs_original": ref_ms / ms})
            print(f"{kind} {arch_id}: {acc:.4f} {ms:.3f} ms ({ref_ms / ms:.2f}x)", file=sys.stderr)
    doc = {"machine": _machine(), "original": largest, "points": results, "command": "python " + " ".join(sys.argv),
           "original_latency_ms_median": statistics.median(r["original_latency_ms"] for r in results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(doc, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sup = [r for r in results if r["kind"] == "supernet"]
    ax.plot([r["latency_ms"] for r in sup], [100 * r["test_acc"] for r in sup], "o-", label="hmt front (one supernet)")
    for r in results:
        if r["kind"] != "supernet":
            ax.plot(r["latency_ms"], 100 * r["test_acc"], "s")
            ax.annotate(r["kind"].removeprefix("alone: "), (r["latency_ms"], 100 * r["test_acc"]), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel(f"ONNX Runtime latency, batch 1, {args.threads} thread(s) [ms]")
    ax.set_ylabel("CIFAR-10 test accuracy [%]")
    ax.set_title(doc["machine"][:60], fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{args.out}.png", dpi=120)


if __name__ == "__main__":
    main()
