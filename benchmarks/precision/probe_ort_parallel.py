"""ORT's parallel execution mode vs sequential on the largest r20 variant (merged chain), median ms.

    PYTHONPATH=$PWD python3 benchmarks/precision/probe_ort_parallel.py   # needs runs/r20-converted
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hmt.convert.graph import load_onnx
from hmt.fuse.engines.ort import OrtConfig, merge_chain
from hmt.fuse.engines.timing import measure_alternating
from hmt.fuse.runtime import ort_step

d = "runs/r20-converted/cifar_resnet20-e38933.e2.BBBBBBBBB/"
graphs = [load_onnx(d + f"segment_{i}.onnx") for i in range(3)] + [load_onnx(d + "exit_2.onnx")]
model = merge_chain(graphs).SerializeToString()
x = {"input": np.zeros((1, 3, 32, 32), np.float32)}
par = "parallel"
cfgs = {"seq": OrtConfig(), "par": OrtConfig(execution_mode=par),
        "par-i1-e2": OrtConfig(execution_mode=par, intra_op_threads=1, inter_op_threads=2),
        "par-i1-e2-nospin": OrtConfig(execution_mode=par, intra_op_threads=1, inter_op_threads=2, allow_spinning=False),
        "par-i1-e1": OrtConfig(execution_mode=par, intra_op_threads=1, inter_op_threads=1)}
runners = {k: (lambda step=ort_step(model, c): step(x)) for k, c in cfgs.items()}
t = measure_alternating(runners, warmup=3, repeats=16, burst=8, drop_slower_than=None)
print({k: round(v.median_ms, 3) for k, v in t.items()})
