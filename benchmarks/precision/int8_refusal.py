"""Would pareto's precision gene keep each INT8 twin of the shipped supernet's variants?

For every variant of ``--converted``: hmt's INT8 chain (``quantize_chain``, as pareto makes it,
calibrated on the supernet's stored images), its accuracy and the fp32 chain's on
``--max-samples`` test images (``chain_accuracy``, every exit, as pareto measures), the
latency ratio timed by ``hmt.precision.measure.time_chains`` exactly as
``hmt.pareto.precision.expand_precisions`` calls it (graph by graph, default threads, 40
timed calls: rounds of alternating bursts), and ``hmt.pareto.precision.refusal``'s verdict.

    python -m benchmarks.precision int8_refusal --supernet hmt/data/embedded/supernet-cifar-resnet56 \\
        --converted runs/r56-converted --data ../shared/datasets/cifar10-jpeg   # results/int8_refusal.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

BENCH = Driver(
    baseline="the FP32 twin of each variant, timed in the same rounds as pareto times them",
    needs="a converted artifact of the supernet and held-out data (--supernet, --converted, --data)",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--supernet", type=Path, required=True)
    p.add_argument("--converted", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--max-samples", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    logging.disable(logging.WARNING)  # the quantiser's pre-processing advice at every call

    from hmt.pareto.data import held_out_data
    from hmt.pareto.precision import PrecisionOptions, read_chains, refusal
    from hmt.precision.accuracy import chain_accuracy
    from hmt.precision.calibration import calibration_array, held_out_arrays
    from hmt.precision.measure import time_chains
    from hmt.precision.quantize import QuantOptions, quantize_chain
    from hmt.supernet import load_supernet

    options = PrecisionOptions(precisions=("fp32", "int8"), max_accuracy_drop=0.01)
    loaded = load_supernet(a.supernet)
    x, y = held_out_arrays(held_out_data(loaded, data_path=a.data, split="test", max_samples=a.max_samples, seed=0))
    calibration = calibration_array(loaded)
    out: dict[str, Any] = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                       "load_avg_start": list(os.getloadavg())},
                           "command": "python3 " + " ".join(sys.argv), "test_images": len(y), "variants": []}
    for arch_id, (segs, exits) in read_chains(a.converted).items():
        q_chain = quantize_chain(segs, exits, calibration, "int8",
                                 options=QuantOptions(calibration_samples=options.calibration_samples))
        fp32_acc, q_acc = chain_accuracy(segs, exits, x, y), chain_accuracy(*q_chain, x, y)
        timings = time_chains({"fp32": (segs, exits), "int8": q_chain}, x[:1], repeats=options.timing_repeats)
        ratio = timings["int8"].median_ms / timings["fp32"].median_ms
        drop = fp32_acc[-1] - q_acc[-1]
        verdict = refusal(drop, ratio, True, options)
        row = {"arch_id": arch_id, "fp32_accuracy": fp32_acc[-1], "int8_accuracy": q_acc[-1],
               "drop_points": round(100 * drop, 2), "fp32_median_ms": round(timings["fp32"].median_ms, 4),
               "int8_median_ms": round(timings["int8"].median_ms, 4), "latency_ratio": round(ratio, 3),
               "admitted": verdict is None, "refused_because": verdict}
        print(json.dumps(row), file=sys.stderr, flush=True)
        out["variants"].append(row)
    out["machine"]["load_avg_end"] = list(os.getloadavg())
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
