"""A deploy bundle whose model is heavy enough for offloading to matter on a fast CPU (random weights).

The demo's ResNet-8 runs in ~0.7 ms on one EPYC core: no link beats that. This bundle has one
variant of CIFAR-10 input shape with real, seeded convolutions (~0.5 GMAC): stage 0 is four
3x3 convolutions at 128 channels and full resolution, then a stride-4 1x1 convolution down to
16x8x8 (1,024 values, 4 kB in fp32: a small tensor at a stage boundary); stage 1 is four 3x3
convolutions at 128 channels on 8x8 and a global pool. Each exit pools and applies a linear
layer. The weights are random (seeded): its answers are a function to reproduce, not a
classifier (accuracy ~10%), so the offload benchmark compares modes by their agreement with
the local answer as well as by accuracy.

    python -m benchmarks.offload.synthetic_bundle --out runs/synthetic-bundle
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hmt.artifacts import ArtifactWriter
from hmt.pareto.index import FrontIndex, IndexEntry

CLASSES = 10
SHAPES = {"input": [1, 3, 32, 32], 0: [1, 16, 8, 8], 1: [1, 128, 1, 1]}


def _w(rng: np.random.Generator, name: str, *shape: int) -> Any:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)


def _model(nodes: list[Any], x: Any, y: Any, inits: list[Any]) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _convs(rng: np.random.Generator, prefix: str, x: str, c_in: int, c: int,
           n: int) -> tuple[list[Any], list[Any], str]:
    nodes, inits, last = [], [], x
    for i in range(n):
        w, b = f"{prefix}w{i}", f"{prefix}b{i}"
        inits += [_w(rng, w, c, c_in if i == 0 else c, 3, 3), numpy_helper.from_array(np.zeros(c, np.float32), b)]
        nodes += [helper.make_node("Conv", [last, w, b], [f"{prefix}c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"{prefix}c{i}"], [f"{prefix}r{i}"])]
        last = f"{prefix}r{i}"
    return nodes, inits, last


def segment(rng: np.random.Generator, k: int) -> onnx.ModelProto:
    if k == 0:
        x = helper.make_tensor_value_info("input", TensorProto.FLOAT, SHAPES["input"])
        nodes, inits, last = _convs(rng, "s0", "input", 3, 128, 4)
        inits += [_w(rng, "down", 16, 128, 1, 1)]
        nodes += [helper.make_node("Conv", [last, "down"], ["features_0"], strides=[4, 4])]
    else:
        x = helper.make_tensor_value_info("features_0", TensorProto.FLOAT, SHAPES[0])
        nodes, inits, last = _convs(rng, "s1", "features_0", 16, 128, 4)
        nodes += [helper.make_node("GlobalAveragePool", [last], ["features_1"])]
    y = helper.make_tensor_value_info(f"features_{k}", TensorProto.FLOAT, SHAPES[k])
    return _model(nodes, x, y, inits)


def exit_head(rng: np.random.Generator, k: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info(f"features_{k}", TensorProto.FLOAT, SHAPES[k])
    y = helper.make_tensor_value_info(f"logits_{k}", TensorProto.FLOAT, [1, CLASSES])
    nodes = [helper.make_node("GlobalAveragePool", [x.name], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wl", "bl"], [y.name])]
    channels = SHAPES[k][1]
    return _model(nodes, x, y, [_w(rng, "wl", channels, CLASSES),
                                numpy_helper.from_array(np.zeros(CLASSES, np.float32), "bl")])


def _spec(name: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": "float32"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_bundle(args.out, args.seed)


def write_bundle(out: Path, seed: int) -> Path:
    """Write the synthetic bundle at ``out`` (an artifact folder, replaced atomically)."""
    rng = np.random.default_rng(seed)
    arch_id = "synthetic-conv.e1"
    with ArtifactWriter(out, kind="bundle", config={"synthetic": True, "seed": seed, "target": "x86-64"}) as writer:
        segments, exits = [], []
        for k in range(2):
            writer.write_bytes(f"variants/{arch_id}/segment_{k}.onnx", segment(rng, k).SerializeToString())
            writer.write_bytes(f"variants/{arch_id}/exit_{k}.onnx", exit_head(rng, k).SerializeToString())
            feature_in = _spec("features_0", SHAPES[0]) if k else _spec("input", SHAPES["input"])
            segments.append({"index": k, "input": feature_in, "output": _spec(f"features_{k}", SHAPES[k]),
                             "onnx": f"variants/{arch_id}/segment_{k}.onnx"})
            exits.append({"index": k, "input": _spec(f"features_{k}", SHAPES[k]),
                          "output": _spec(f"logits_{k}", [1, CLASSES]), "onnx": f"variants/{arch_id}/exit_{k}.onnx",
                          "consumes_segment": k})
        variant = {"arch_id": arch_id, "exit_stage": 1, "accuracy": 0.1, "accuracy_per_exit": [0.1, 0.1],
                   "latency_ms": 10.0, "energy": 1.0, "memory_mb": 2.0, "segments": segments, "exits": exits,
                   "preferred_engine": "onnxruntime", "engines": ["onnxruntime"]}
        # The target record serve's structural checks compare with the registry (hmt.bundle).
        target = {"name": "x86-64", "arch": "x86_64", "elf_machine": "x86_64"}
        writer.write_json("bundle.json", {"version": 1, "target": target, "classes": CLASSES,
                                          "input": _spec("input", SHAPES["input"]), "variants": [variant],
                                          "notes": ["synthetic: random seeded weights, for the offload benchmark"]})
        writer.write_json("profile.json", {"device": "synthetic"})
        writer.write_json("index.json", FrontIndex([IndexEntry(arch_id, 0.1, 10.0, 1.0, 2.0, 1, (0.1, 0.1),
                                                               "onnxruntime")]).to_json_dict())
        writer.write_json("serve.json", {})
    return out


if __name__ == "__main__":
    main()
