"""INT8 vs FP32 per 3x3 convolution as a function of channel count, and what a residual Add costs.

Synthetic chains of 10 identical 3x3 convolutions (C -> C channels, HxW map, Relu after each)
and of 5 residual blocks (conv-relu-conv-add-relu: 10 convolutions, 5 Adds), fp32 against
their QDQ U8S8 per-channel INT8 copies (ORT, ``all`` level, 1 thread), one alternating loop
each. Prints microseconds per convolution and the fp32/int8 ratio: where INT8 stops paying
(narrow channels: MLAS's fast symmetric kernel needs >= 16 output channels) and how much of
a ResNet block's INT8 time the quantised Add takes (fp32 fuses Add+Relu into the Conv).

    flock /tmp/hmt-bench.lock python3 benchmarks/precision/probe_int8_width.py \
        --out benchmarks/precision/probe_int8_width.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def chain(c: int, hw: int, residual: bool, rng: Any, n: int = 10) -> Any:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], "x"
    block_in = x  # input of the current residual block
    for i in range(n):
        inits += [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(c)).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        if residual and i % 2 == 1:
            nodes += [helper.make_node("Add", [f"c{i}", block_in], [f"a{i}"]),
                      helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        else:
            block_in = x
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, hw, hw])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> int:
    import numpy as np
    from probe_int8_r56 import FORMS, quantise, session

    from hmt.fuse.engines.timing import measure_alternating

    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    out: dict[str, Any] = {"command": " ".join(sys.argv), "load_avg_start": os.getloadavg(), "rows": rows}
    # (channels, map): the widths of the shipped ResNet-56 variants at their stages (32x32, 16x16, 8x8)
    cases = [(c, 32) for c in (8, 12, 16, 24, 32)] + [(16, 16), (24, 16), (32, 16), (32, 8), (48, 8), (64, 8)]
    for residual in (False, True):
        for c, hw in cases:
            model = chain(c, hw, residual, rng)
            cal = rng.standard_normal((16, c, hw, hw)).astype(np.float32)
            models = {"fp32": model, "int8": quantise(model, cal, FORMS["qdq"])}
            if c < 16:
                models["int8-pad16"] = quantise(model, cal, FORMS["qdq-pad"])
            feeds = {"x": cal[:1]}
            runners = {k: (lambda s=session(m, 1, "all"), f=feeds: s.run(None, f)) for k, m in models.items()}
            t = measure_alternating(runners, warmup=10, repeats=a.repeats, burst=8, drop_slower_than=None)
            us = {k: round(1000 * v.median_ms / 10, 2) for k, v in t.items()}
            row = {"channels": c, "map": hw, "residual": residual, "us_per_conv": us,
                   "speedup": {k: round(us["fp32"] / v, 3) for k, v in us.items() if k != "fp32"},
                   "mmacs_per_conv": round(c * c * 9 * hw * hw / 1e6, 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out["load_avg_end"] = os.getloadavg()
    out["when_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
