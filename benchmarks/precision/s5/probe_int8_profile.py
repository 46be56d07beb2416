"""Where INT8 time goes on the variants that miss 2x, and which INT8 forms could pay (session 5).

Per variant (the full-depth path merged into one graph, batch 1, ORT CPU, 1 intra-op
thread, level ``all``):

- ``fp32``          the merged float chain (the baseline);
- ``int8-hmt``      hmt's INT8 chain (``quantize_chain``: each segment/exit quantised and
                    calibrated apart, narrow channels padded where measured faster), then merged:
                    what pareto and the bundle ship;
- ``int8-merged``   the merged float chain quantised as one graph (no dequantise/quantise
                    pair where two graphs meet);
- ``int8-merged-pad`` the same after ``hmt.precision.pad`` (activations under 16 channels
                    zero-padded to 16: MLAS's fast symmetric INT8 convolution);
- ``int8-ends-fp32`` the merged (padded where narrow) graph with the first convolution and the
                    exit head (pool + classifier) left in fp32;
- ``int8-first-fp32`` only the first convolution (3 input channels) left in fp32.

Each form: ORT's profiler (per-op-type microseconds per inference over ``--profile-runs``
runs, the first 20 dropped), the optimised graph's op counts, a timing against fp32 in one loop
(rounds of alternating bursts of 20, 4 dropped, median of round medians, as fuse times) and
top-1 accuracy on the test images (``--data``: all 10k of CIFAR-10 by default).

    flock /tmp/hmt-bench.lock python3 benchmarks/precision/s5/probe_int8_profile.py \\
        --supernet hmt/data/embedded/supernet-cifar-resnet56 --converted runs/r56-converted \\
        --data ../shared/datasets/cifar10-jpeg --variant e2.555555555555555555555555555555 ... \\
        --out benchmarks/precision/s5/probe_int8_profile.json
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

FORMS = ("fp32", "int8-hmt", "int8-merged", "int8-merged-pad", "int8-ends-fp32", "int8-first-fp32")


def log(msg: str) -> None:
    print(f"[probe {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def session(model: Any, *, profile_prefix: str | None = None, dump: str | None = None) -> Any:
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.log_severity_level = 3
    o.intra_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix:
        o.enable_profiling = True
        o.profile_file_prefix = profile_prefix
    if dump:
        o.optimized_model_filepath = dump
    return ort.InferenceSession(model.SerializeToString(), o, providers=["CPUExecutionProvider"])


def quantise(model: Any, calibration: list[Any], *, exclude: list[str] | None = None) -> Any:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(calibration)

        def get_next(self) -> dict[str, Any] | None:
            x = next(self.items, None)
            return None if x is None else {name: x}

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = f"{tmp}/f.onnx", f"{tmp}/q.onnx"
        onnx.save(model, src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude or [])
        return onnx.load(dst)


def profile(model: Any, x: Any, runs: int) -> dict[str, Any]:
    """Per op type: microseconds per inference (ORT's profiler, node events), node count; and the wall per run."""
    name = model.graph.input[0].name
    with tempfile.TemporaryDirectory() as tmp:
        s = session(model, profile_prefix=f"{tmp}/p")
        for _ in range(20):
            s.run(None, {name: x})
        t0 = time.perf_counter()
        for _ in range(runs):
            s.run(None, {name: x})
        wall_us = (time.perf_counter() - t0) / runs * 1e6
        events = json.loads(Path(s.end_profiling()).read_text())
    per_op: dict[str, float] = collections.defaultdict(float)
    per_run: dict[str, int] = collections.defaultdict(int)
    model_run_us: list[float] = []
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
            per_run[e["args"]["op_name"]] += 1
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            model_run_us.append(e["dur"])
    total_runs = 20 + runs
    timed = model_run_us[20:]
    ranked = sorted(per_op.items(), key=lambda kv: -kv[1])
    return {"op_us_per_inference": {k: round(v / total_runs, 2) for k, v in ranked},
            "op_nodes": {k: round(v / total_runs) for k, v in per_run.items()},
            "kernel_us_per_inference": round(sum(per_op.values()) / total_runs, 2),
            "model_run_us_median": round(sorted(timed)[len(timed) // 2], 2) if timed else None,
            "python_wall_us_per_run_with_profiler": round(wall_us, 2)}


def optimised_ops(model: Any) -> dict[str, int]:
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        session(model, dump=f"{tmp}/o.onnx")
        return dict(collections.Counter(n.op_type for n in onnx.load(f"{tmp}/o.onnx").graph.node))


def accuracy(model: Any, x: Any, y: Any) -> float:
    import numpy as np

    s = session(model)
    name = model.graph.input[0].name
    hits = 0
    for i in range(len(x)):
        hits += int(np.argmax(s.run(None, {name: x[i: i + 1]})[0]) == y[i])
    return hits / len(x)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--supernet", type=Path, required=True)
    p.add_argument("--converted", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--variant", action="append", required=True, help="arch id suffix after the space prefix")
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--profile-runs", type=int, default=300)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    logging.disable(logging.WARNING)  # the quantiser's pre-processing advice at every call

    import numpy as np
    import onnxruntime as ort

    from hmt.fuse.engines.ort import merge_chain
    from hmt.fuse.engines.timing import measure_rounds
    from hmt.pareto.data import held_out_data
    from hmt.pareto.precision import read_chains
    from hmt.precision.calibration import calibration_array, held_out_arrays
    from hmt.precision.pad import pad_channels
    from hmt.precision.quantize import QuantOptions, quantize_chain
    from hmt.supernet import load_supernet

    loaded = load_supernet(a.supernet)
    data = held_out_data(loaded, data_path=a.data, split="test", max_samples=a.max_samples, seed=0)
    x_test, y_test = held_out_arrays(data)
    cal_all = calibration_array(loaded)
    calibration = [c[None].astype(np.float32) for c in cal_all[:256]]
    chains = read_chains(a.converted)
    forms = a.forms.split(",")
    out: dict[str, Any] = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                       "onnxruntime": ort.__version__, "load_avg_start": list(os.getloadavg())},
                           "command": "python3 " + " ".join(sys.argv), "test_images": len(y_test),
                           "calibration_images": len(calibration), "variants": {}}
    for suffix in a.variant:
        arch_id = next(k for k in chains if k.endswith(suffix))
        segs, exits = chains[arch_id]
        models: dict[str, Any] = {"fp32": merge_chain([*segs, exits[-1]])}
        n_graphs = len(segs) + 1
        if "int8-hmt" in forms:
            qs, qe = quantize_chain(segs, exits, cal_all, "int8", options=QuantOptions())
            models["int8-hmt"] = merge_chain([*qs, qe[-1]])
        merged = models["fp32"]
        padded, report = pad_channels(merged, minimum=16)
        narrow = bool(report.padded)
        if "int8-merged" in forms:
            models["int8-merged"] = quantise(merged, calibration)
        if "int8-merged-pad" in forms and narrow:
            models["int8-merged-pad"] = quantise(padded, calibration)
        base = padded if narrow else merged
        convs = [n.name for n in base.graph.node if n.op_type == "Conv"]
        head = [n.name for n in base.graph.node if n.name.startswith(f"chain{n_graphs - 1}_")] if n_graphs > 1 else []
        if "int8-ends-fp32" in forms:
            models["int8-ends-fp32"] = quantise(base, calibration, exclude=convs[:1] + head)
        if "int8-first-fp32" in forms:
            models["int8-first-fp32"] = quantise(base, calibration, exclude=convs[:1])
        x1 = x_test[:1]
        name = merged.graph.input[0].name
        sessions = {k: session(m) for k, m in models.items()}
        feeds = {name: x1}
        runners = {k: (lambda s=s, feeds=feeds: s.run(None, feeds)) for k, s in sessions.items()}
        timings = measure_rounds(runners, rounds=a.rounds, burst=20, drop=4, warmup=10, drop_slower_than=None)
        row: dict[str, Any] = {"arch_id": arch_id, "padded_narrow_channels": narrow,
                               "head_nodes_left_fp32": len(head), "forms": {}}
        fp32_ms = timings["fp32"].median_ms
        for k, m in models.items():
            log(f"{arch_id} {k}: profiling, accuracy on {len(y_test)} images")
            row["forms"][k] = {"median_ms": round(timings[k].median_ms, 5),
                               "round_medians_ms": [round(v, 5) for v in timings[k].round_medians_ms],
                               "speedup_vs_fp32": round(fp32_ms / timings[k].median_ms, 3),
                               "optimised_ops": optimised_ops(m), "profile": profile(m, x1, a.profile_runs),
                               "test_accuracy": accuracy(m, x_test, y_test)}
            f = row["forms"][k]
            log(f"  {f['median_ms']:.4f} ms, {f['speedup_vs_fp32']:.2f}x, acc {f['test_accuracy']:.4f}, "
                f"ops {f['profile']['op_us_per_inference']}")
        out["variants"][arch_id] = row
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=2) + "\n")
    out["machine"]["load_avg_end"] = list(os.getloadavg())
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
