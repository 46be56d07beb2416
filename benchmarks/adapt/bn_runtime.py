"""Cost of the torch-free BN path: the adaptable inference graphs (segments + the last exit,
BN as Mul/Add initializers that ORT folds) against the same variant exported as one graph
with BN folded by the exporter, and one re-estimation batch.

    PYTHONPATH=$PWD python -m benchmarks.adapt.bn_runtime --supernet runs/r20-pre --bn runs/r20pre-bn \
        --arch largest --out benchmarks/adapt/runtime_r20pre_largest.json

ONNX Runtime, one thread, batch 1 and 32, medians of --repeats interleaved calls (both graphs
alternate, so a load change on a shared machine hits both alike).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import Driver

BENCH = Driver(
    baseline="the same variant exported as one graph with BN folded by the exporter, timed interleaved "
             "with the adaptable graphs",
    needs="a supernet and a BN-adaptable bundle (--supernet, --bn)",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--bn", type=Path, required=True, help="the variant's bn-adaptable export")
    parser.add_argument("--arch", default="largest")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import onnxruntime as ort
    import torch

    from hmt.adapt.bn_runtime import BnReestimator
    from hmt.convert.export import export_module
    from hmt.supernet import load_supernet

    torch.set_num_threads(1)
    loaded = load_supernet(args.supernet)
    arch = {"largest": loaded.space.largest, "smallest": loaded.space.smallest}.get(args.arch, lambda: None)()
    arch = arch or loaded.space.parse(args.arch)
    model = loaded.materialize(arch)
    runtime = BnReestimator(args.bn)
    rng = np.random.default_rng(0)
    report: dict[str, object] = {"command": " ".join(sys.argv), "load_average": os.getloadavg()[0],
                                 "arch": arch.arch_id, "ort": ort.__version__}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for batch in (1, 32):
        x = rng.normal(size=(batch, *loaded.model_info["input_shape"])).astype(np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            proto, _ = export_module(model, [torch.from_numpy(x)], input_names=["input"], output_names=["logits"])
            path = Path(tmp) / "fused.onnx"
            path.write_bytes(proto.SerializeToString())
            fused = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        adaptable = runtime.shipped()
        np.testing.assert_allclose(adaptable.run_last(x), fused.run(None, {"input": x})[0], rtol=1e-3, atol=1e-3)
        times: dict[str, list[float]] = {"fused": [], "adaptable": []}
        for _ in range(args.repeats):
            t = time.perf_counter()
            fused.run(None, {"input": x})
            times["fused"].append(time.perf_counter() - t)
            t = time.perf_counter()
            adaptable.run_last(x)
            times["adaptable"].append(time.perf_counter() - t)
        med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        report[f"batch{batch}_ms"] = med | {"ratio": med["adaptable"] / med["fused"]}
        print(f"batch {batch}: fused {med['fused']:.3f} ms, adaptable {med['adaptable']:.3f} ms "
              f"({med['adaptable'] / med['fused']:.2f}x)", flush=True)
    x = rng.normal(size=(128, *loaded.model_info["input_shape"])).astype(np.float32)
    observe = []
    for _ in range(10):
        t = time.perf_counter()
        runtime.observe(x)
        observe.append(time.perf_counter() - t)
    t = time.perf_counter()
    runtime.adapted()
    report["observe_batch128_ms"] = float(np.median(observe)) * 1e3
    report["build_adapted_ms"] = (time.perf_counter() - t) * 1e3
    print(f"observe (batch 128): {report['observe_batch128_ms']:.1f} ms; build adapted: "
          f"{report['build_adapted_ms']:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
