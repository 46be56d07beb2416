"""Benchmark INT8 (and optionally FP16) variants against FP32: accuracy on held-out images, latency.

For each variant of a supernet (``--variant`` ids, ``largest`` / ``smallest``, ``--random N``
seeded samples, or every point of ``--pareto``'s front up to ``--max-variants``):

1. ``hmt convert`` makes the verified FP32 chain (segments + exit heads), or the chains
   are read from an existing ``--converted`` artifact of the same supernet;
2. ``hmt.precision.quantize`` makes the INT8 chain (QDQ, per-channel weights, activation
   ranges calibrated on the supernet's stored calibration images);
3. both chains classify the held-out images through ONNX Runtime (every exit), so the
   accuracy of the INT8 variant is measured, and compared with the FP32 one;
4. the full-depth path (every segment, then the last exit) of FP32 and INT8 is timed in
   one alternating loop (bursts, as fuse times), at ORT's default thread count and at one
   thread, graph by graph (serve's early-exit path) and merged into one graph (fuse's
   chain candidate: one ORT call, no dequantise/quantise between segments).

The machine may be shared: ratios measured in one loop are the figures; each result
records the load average, CPU and versions.

    python -m benchmarks.precision.int8 --supernet runs/r20 --data ../shared/datasets/cifar10-jpeg \
        --split test --variant largest --variant smallest --random 2 --out benchmarks/precision/int8_r20_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def log(msg: str) -> None:
    print(f"[bench_precision {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    import onnxruntime as ort

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "onnxruntime": ort.__version__,
            "providers": ort.get_available_providers(), "load_avg_start": list(os.getloadavg())}


def variant_ids(loaded: Any, args: argparse.Namespace) -> list[str]:
    import numpy as np

    ids: list[str] = []
    for v in args.variant:
        arch = {"largest": loaded.space.largest, "smallest": loaded.space.smallest}.get(v)
        ids.append(arch().arch_id if arch else loaded.space.parse(v).arch_id)
    rng = np.random.default_rng(args.seed)
    for _ in range(args.random):
        ids.append(loaded.space.sample(rng).arch_id)
    if args.pareto:
        from hmt.pareto.artifact import front_variant_ids, load_front

        ids += front_variant_ids(load_front(args.pareto), max_variants=args.max_variants)
    return list(dict.fromkeys(ids))


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    """INT8 against FP32 per variant: accuracy drop at the last exit and the one-thread merged speed-up."""
    claims = []
    for v in report["variants"]:
        tail = v["arch_id"].rsplit(".", 1)[-1]
        if "int8" in v:
            claims.append({"claim": f"INT8 accuracy drop against FP32, last exit ({tail}, "
                                    f"{report['data']['samples']} images)",
                           "figure": f"{v['int8']['drop_points']:+.2f} points"})
        lat = v.get("latency[merged,threads=1]", {})
        if "speedup_int8" in lat:
            claims.append({"claim": f"INT8 speed-up over FP32, merged chain, 1 thread ({tail})",
                           "figure": f"{lat['speedup_int8']:.2f}x ({lat['fp32']['median_ms']:.3f} -> "
                                     f"{lat['int8']['median_ms']:.3f} ms)"})
    return claims


BENCH = Driver(
    baseline="the FP32 chain of the same variant: accuracy on the same images, latency in the same "
             "alternating loop",
    quick=["--supernet", "{supernet}", "--variant", "smallest", "--data", "{repo}/hmt/data/embedded",
           "--max-samples", "200", "--calibration-samples", "32", "--repeats", "20", "--out", "{report}"],
    default=["--supernet", "{supernet}", "--variant", "largest", "--variant", "smallest",
             "--data", "{repo}/hmt/data/embedded", "--out", "{report}"],
    claims=_claims,
    timeout_s=7200,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--converted", type=Path,
                        help="reuse this converted artifact of --supernet (written here first if absent)")
    parser.add_argument("--variant", action="append", default=[], help="arch id, largest or smallest (repeat)")
    parser.add_argument("--random", type=int, default=0, help="seeded random variants to add")
    parser.add_argument("--pareto", type=Path, help="add the front of this pareto artifact")
    parser.add_argument("--max-variants", type=int, default=4)
    parser.add_argument("--data", type=Path, help="held-out data (default: the supernet's validation split)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-samples", type=int, help="stratified subset of the held-out images")
    parser.add_argument("--precision", action="append", default=[], help="int8 (default) and/or fp16")
    parser.add_argument("--activation", default="uint8", choices=("uint8", "int8"))
    parser.add_argument("--calibration-samples", type=int, default=256)
    parser.add_argument("--pad-channels", type=int, default=16,
                        help="zero-pad narrow INT8 graphs to N channels (0: off)")
    parser.add_argument("--compare-unpadded", action="store_true",
                        help="also measure INT8 without channel padding (row key int8_unpadded)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, action="append", default=[], help="ORT intra-op threads (0: default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    precisions = args.precision or ["int8"]
    threads_list = args.threads or [0, 1]

    from hmt.pareto.data import held_out_data
    from hmt.pareto.precision import read_chains
    from hmt.precision.accuracy import chain_accuracy
    from hmt.precision.calibration import calibration_array, held_out_arrays
    from hmt.precision.measure import time_chains
    from hmt.precision.quantize import QuantOptions, quantize_chain
    from hmt.supernet import load_supernet

    result: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv), "variants": []}
    loaded = load_supernet(args.supernet)
    ids = variant_ids(loaded, args)
    if not ids:
        parser.error("no variants: give --variant, --random or --pareto")
    data = held_out_data(loaded, data_path=args.data, split=args.split, max_samples=args.max_samples, seed=args.seed)
    x, y = held_out_arrays(data)
    calibration = calibration_array(loaded)
    options = QuantOptions(activation=args.activation, calibration_samples=args.calibration_samples,
                           pad_channels=args.pad_channels)
    variants_to_make = [(p, p, options) for p in precisions]
    if args.compare_unpadded and "int8" in precisions:
        from dataclasses import replace

        variants_to_make.append(("int8_unpadded", "int8", replace(options, pad_channels=0)))
    result.update({"supernet": str(args.supernet), "data": data.describe(), "quantisation": options.to_json()})
    log(f"{len(ids)} variants, {len(y)} held-out images ({data.source}), {len(calibration)} calibration samples")
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as tmp:
        converted = args.converted
        if converted is None or not converted.exists():
            from hmt.convert import SupernetSource, convert_model

            converted = converted or Path(tmp) / "converted"
            log(f"converting (fp32, verified against torch) -> {converted}")
            convert_model(SupernetSource(args.supernet, tuple(ids)), converted)
        available = read_chains(converted)
        for vid in ids:
            if vid not in available:
                raise SystemExit(f"{converted}: no converted variant {vid}")
            segs, exits = available[vid]
            row: dict[str, Any] = {"arch_id": vid, "exits": len(exits)}
            t0 = time.perf_counter()
            fp32_acc = chain_accuracy(segs, exits, x, y)
            row["fp32"] = {"accuracy_per_exit": fp32_acc, "eval_s": round(time.perf_counter() - t0, 1)}
            quantised = {}
            for label, precision, quant_options in variants_to_make:
                t0 = time.perf_counter()
                q = quantize_chain(segs, exits, calibration, precision, options=quant_options)
                quant_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                acc = chain_accuracy(*q, x, y)
                quantised[label] = q
                row[label] = {"accuracy_per_exit": acc, "quantise_s": round(quant_s, 1),
                                  "eval_s": round(time.perf_counter() - t0, 1),
                                  "drop_points": round(100 * (fp32_acc[-1] - acc[-1]), 3)}
            feed = x[:1]
            speedups: dict[str, list[str]] = {p: [] for p in quantised}
            for merged in (False, True):
                for threads in threads_list:
                    timings = time_chains({"fp32": (segs, exits), **quantised}, feed, threads=threads,
                                          repeats=args.repeats, merged=merged)
                    key = f"{'merged' if merged else 'per_graph'},threads={threads or 'default'}"
                    row[f"latency[{key}]"] = {k: t.to_json() for k, t in timings.items()}
                    for p in quantised:
                        ratio = round(timings["fp32"].median_ms / timings[p].median_ms, 3)
                        row[f"latency[{key}]"][f"speedup_{p}"] = ratio
                        speedups[p].append(f"{key}: x{ratio}")
            log(f"{vid}: fp32 {100 * fp32_acc[-1]:.2f}% " + "; ".join(
                f"{p} {100 * row[p]['accuracy_per_exit'][-1]:.2f}% ({', '.join(speedups[p])})" for p in quantised))
            result["variants"].append(row)
    result["machine"]["load_avg_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
