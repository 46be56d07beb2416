"""Which INT8 form runs fastest on this CPU, per variant of the shipped supernet (merged chain, batch 1).

For each variant: the full-depth path merged into one graph (fuse's chain candidate), then
quantised as one graph (calibrated on the supernet's stored calibration images) in several
forms, each timed against the variant's fp32 graph in one alternating loop (bursts of 8):

- ``qdq``     QDQ, U8S8 (uint8 activations, int8 per-channel weights): hmt's default
- ``qdq-pt``  QDQ, U8S8, per-tensor weights
- ``qdq-u8u8`` QDQ, uint8 weights too
- ``qdq-s8s8`` QDQ, int8 activations
- ``qop``     QOperator (QLinearConv / QLinearAdd written by the quantiser), U8S8 per channel
- ``qdq-rr``  QDQ U8S8 with reduce_range (7-bit weights; needed on AVX2-only CPUs)
- ``qdq-pad`` QDQ U8S8 after ``hmt.precision.pad.pad_channels`` (narrow tensors zero-padded to 16 channels)
- ``qdq-mixed`` QDQ U8S8 with every node writing fewer than 16 channels left in fp32 (mixed precision)
- ``fp32-pad`` the padded graph in fp32 (is padding alone a speed-up? then it is the fair baseline)
- ``*-ext``   the same graph at ORT's ``extended`` level instead of ``all`` (no NCHWc for fp32)

It prints, per variant, the median ms and the fp32/int8 ratio of each form at 1 and 2 intra-op
threads, and which op types ORT actually runs (the optimised graph), so a slow form can be
traced to the kernels it falls back to.

    flock /tmp/hmt-bench.lock python3 benchmarks/precision/probe_int8_r56.py --converted runs/r56-converted \
        --supernet hmt/data/embedded/supernet-cifar-resnet56 --out benchmarks/precision/probe_int8_r56.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FORMS: dict[str, dict[str, Any]] = {
    "qdq": {"fmt": "qdq", "per_channel": True, "act": "u8", "w": "s8", "rr": False},
    "qdq-pt": {"fmt": "qdq", "per_channel": False, "act": "u8", "w": "s8", "rr": False},
    "qdq-u8u8": {"fmt": "qdq", "per_channel": True, "act": "u8", "w": "u8", "rr": False},
    "qdq-s8s8": {"fmt": "qdq", "per_channel": True, "act": "s8", "w": "s8", "rr": False},
    "qop": {"fmt": "qop", "per_channel": True, "act": "u8", "w": "s8", "rr": False},
    "qdq-rr": {"fmt": "qdq", "per_channel": True, "act": "u8", "w": "s8", "rr": True},
    "qdq-pad": {"fmt": "qdq", "per_channel": True, "act": "u8", "w": "s8", "rr": False, "pad": True},
    "fp32-pad": {"fmt": "none", "pad": True},
    "qdq-mixed": {"fmt": "qdq", "per_channel": True, "act": "u8", "w": "s8", "rr": False, "narrow_fp32": True},
}


def narrow_nodes(model: Any, minimum: int = 16) -> list[str]:
    """Names of the nodes writing a 4-d tensor of fewer than ``minimum`` channels (kept fp32 by ``qdq-mixed``)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    channels = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 4 and dims[1].HasField("dim_value"):
            channels[vi.name] = dims[1].dim_value
    return [n.name for n in model.graph.node if any(channels.get(o, minimum) < minimum for o in n.output)]


def quantise(model: Any, cal: Any, form: dict[str, Any]) -> Any:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    if form.get("pad"):
        from hmt.precision.pad import pad_channels

        model = pad_channels(model)[0]
    if form["fmt"] == "none":
        return model
    name = model.graph.input[0].name
    types = {"u8": QuantType.QUInt8, "s8": QuantType.QInt8}

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(cal)

        def get_next(self) -> dict[str, Any] | None:
            x = next(self.items, None)
            return None if x is None else {name: x[None]}

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = f"{tmp}/f.onnx", f"{tmp}/q.onnx"
        onnx.save(model, src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ if form["fmt"] == "qdq"
                        else QuantFormat.QOperator, per_channel=form["per_channel"], reduce_range=form["rr"],
                        activation_type=types[form["act"]], weight_type=types[form["w"]],
                        nodes_to_exclude=narrow_nodes(model) if form.get("narrow_fp32") else None)
        return onnx.load(dst)


def session(model: Any, threads: int, level: str, dump: str | None = None) -> Any:
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.log_severity_level = 3
    o.intra_op_num_threads = threads
    o.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                  "ext": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    if dump:
        o.optimized_model_filepath = dump
    return ort.InferenceSession(model.SerializeToString(), o, providers=["CPUExecutionProvider"])


def optimised_ops(model: Any, level: str) -> dict[str, int]:
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        session(model, 1, level, dump=f"{tmp}/o.onnx")
        return dict(collections.Counter(n.op_type for n in onnx.load(f"{tmp}/o.onnx").graph.node))


def main() -> int:
    import numpy as np

    from hmt.fuse.engines.ort import merge_chain
    from hmt.fuse.engines.timing import measure_alternating
    from hmt.pareto.precision import read_chains
    from hmt.precision.calibration import calibration_array
    from hmt.supernet import load_supernet

    p = argparse.ArgumentParser()
    p.add_argument("--converted", type=Path, required=True)
    p.add_argument("--supernet", type=Path, required=True)
    p.add_argument("--variant", action="append", default=[], help="arch ids (default: all of --converted)")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--levels", default="all")
    p.add_argument("--calibration-samples", type=int, default=128)
    p.add_argument("--repeats", type=int, default=150)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    chains = read_chains(a.converted)
    cal = calibration_array(load_supernet(a.supernet))[: a.calibration_samples]
    x = {0: cal[:1]}
    out: dict[str, Any] = {"command": " ".join(sys.argv), "load_avg_start": os.getloadavg(), "variants": {}}
    for vid in a.variant or list(chains):
        segs, exits = chains[vid]
        fp32 = merge_chain([*segs, exits[-1]])
        models = {"fp32": fp32}
        for f in a.forms.split(","):
            try:
                models[f] = quantise(fp32, cal, FORMS[f])
            except Exception as exc:  # noqa: BLE001 - a form ORT's quantiser cannot write is reported, not fatal
                print(vid, f, "failed:", exc, file=sys.stderr)
        row: dict[str, Any] = {"ops": {}}
        for level in a.levels.split(","):
            row["ops"][level] = {k: optimised_ops(m, level) for k, m in models.items()}
            for threads in [int(t) for t in a.threads.split(",")]:
                sess = {k: session(m, threads, level) for k, m in models.items()}
                feeds = {fp32.graph.input[0].name: x[0]}
                runners = {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sess.items()}
                t = measure_alternating(runners, warmup=10, repeats=a.repeats, burst=8, drop_slower_than=None)
                med = {k: round(v.median_ms, 4) for k, v in t.items()}
                ratio = {k: round(med["fp32"] / v, 3) for k, v in med.items() if k != "fp32"}
                row[f"{level},threads={threads}"] = {"median_ms": med, "speedup": ratio}
                print(f"{vid} {level} t={threads} fp32={med['fp32']:.3f}ms",
                      " ".join(f"{k}:{v}x" for k, v in ratio.items()), flush=True)
        out["variants"][vid] = row
        print(vid, {k: v for k, v in row["ops"][a.levels.split(',')[0]].items() if k in ("fp32", "qdq", "qop")},
              flush=True)
    out["load_avg_end"] = os.getloadavg()
    out["when_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    _ = np
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
