"""INT8 activation type and weight granularity vs fp32 on the largest r20 variant (merged chain, 1 thread).

    PYTHONPATH=$PWD python3 benchmarks/precision/probe_int8_activation.py   # needs runs/r20, runs/r20-converted
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hmt.convert.graph import load_onnx
from hmt.precision.measure import time_chains
from hmt.precision.quantize import QuantOptions, quantize_chain
from hmt.supernet import load_supernet

d = "runs/r20-converted/cifar_resnet20-e38933.e2.BBBBBBBBB/"
segs = [load_onnx(d + f"segment_{i}.onnx") for i in range(3)]
exits = [load_onnx(d + f"exit_{i}.onnx") for i in range(3)]
cal = np.concatenate([b.numpy() for b in load_supernet("runs/r20").calibration_batches()])[:128]
chains = {"fp32": (segs, exits)}
for label, options in {"u8s8": QuantOptions(activation="uint8", calibration_samples=128),
                       "s8s8": QuantOptions(activation="int8", calibration_samples=128),
                       "u8s8-tensor": QuantOptions(activation="uint8", per_channel=False, calibration_samples=128)
                       }.items():
    chains[label] = quantize_chain(segs, exits, cal, "int8", options=options)
t = time_chains(chains, cal[:1], threads=1, repeats=150, merged=True)
print({k: round(v.median_ms, 4) for k, v in t.items()}, {k: round(t["fp32"].median_ms / v.median_ms, 3)
                                                           for k, v in t.items()})
