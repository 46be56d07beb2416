"""A tiny convolutional deploy bundle for the offload tests, built with onnx.helper.

Input [1, 3, 8, 8]. Segment 0 is conv 3x3 -> relu -> conv 3x3 -> + (residual) -> relu ->
conv 1x1 stride 2 -> relu, so it has cuts inside (between its ops, not inside the
residual) and one smaller than the input ([1, 4, 4, 4]). Segment 1 is conv 3x3 -> relu
-> global average pool. Each exit head pools, flattens and applies a linear layer.
Weights come from a seeded generator, so the graphs compute something non-trivial.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parents[1] / "serve"))

from serve_bundles import CLASSES

from hmt.artifacts import ArtifactWriter
from hmt.pareto.index import FrontIndex, IndexEntry

INPUT_SHAPE = [1, 3, 8, 8]
SHAPES = {0: [1, 4, 4, 4], 1: [1, 8, 1, 1]}


def _model(nodes: list[Any], x: Any, y: Any, inits: list[Any]) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _w(rng: np.random.Generator, name: str, *shape: int) -> Any:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name)


def segment_0(rng: np.random.Generator) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, INPUT_SHAPE)
    y = helper.make_tensor_value_info("features_0", TensorProto.FLOAT, SHAPES[0])
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], strides=[2, 2]),
        helper.make_node("Relu", ["c3"], ["features_0"]),
    ]
    inits = [_w(rng, "w1", 8, 3, 3, 3), _w(rng, "b1", 8), _w(rng, "w2", 8, 8, 3, 3), _w(rng, "b2", 8),
             _w(rng, "w3", 4, 8, 1, 1), _w(rng, "b3", 4)]
    return _model(nodes, x, y, inits)


def segment_1(rng: np.random.Generator) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("features_0", TensorProto.FLOAT, SHAPES[0])
    y = helper.make_tensor_value_info("features_1", TensorProto.FLOAT, SHAPES[1])
    nodes = [helper.make_node("Conv", ["features_0", "w4", "b4"], ["c4"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c4"], ["r4"]),
             helper.make_node("GlobalAveragePool", ["r4"], ["features_1"])]
    return _model(nodes, x, y, [_w(rng, "w4", 8, 4, 3, 3), _w(rng, "b4", 8)])


def exit_head(rng: np.random.Generator, k: int) -> onnx.ModelProto:
    x = helper.make_tensor_value_info(f"features_{k}", TensorProto.FLOAT, SHAPES[k])
    y = helper.make_tensor_value_info(f"logits_{k}", TensorProto.FLOAT, [1, CLASSES])
    channels = SHAPES[k][1]
    nodes = [helper.make_node("GlobalAveragePool", [x.name], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wl", "bl"], [y.name])]
    return _model(nodes, x, y, [_w(rng, "wl", channels, CLASSES), _w(rng, "bl", CLASSES)])


def _spec(name: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "shape": shape, "dtype": "float32"}


def make_conv_bundle(out: Path, seed: int = 0, serve: dict[str, Any] | None = None,
                     memory_mb: dict[str, float] | None = None) -> Path:
    """Two variants: ``deep`` (both segments, exit 1) and ``shallow`` (exit 0), different weights
    (``memory_mb``: their recorded footprints, 1 MB each unless given)."""
    memory = {"deep": 1.0, "shallow": 1.0} | (memory_mb or {})
    entries, index_entries = [], []
    with ArtifactWriter(out, kind="bundle", config={"test": "offload"}) as writer:
        for arch_id, exit_stage, accuracy, energy in (("deep", 1, 0.9, 2.0), ("shallow", 0, 0.7, 1.0)):
            rng = np.random.default_rng(seed + exit_stage)
            graphs = [segment_0(rng), segment_1(rng)]
            segments, exits = [], []
            for k in range(exit_stage + 1):
                writer.write_bytes(f"variants/{arch_id}/segment_{k}.onnx", graphs[k].SerializeToString())
                writer.write_bytes(f"variants/{arch_id}/exit_{k}.onnx", exit_head(rng, k).SerializeToString())
                feat_in = f"features_{k - 1}" if k else "input"
                segments.append({"index": k, "input": _spec(feat_in, SHAPES[k - 1] if k else INPUT_SHAPE),
                                 "output": _spec(f"features_{k}", SHAPES[k]),
                                 "onnx": f"variants/{arch_id}/segment_{k}.onnx"})
                exits.append({"index": k, "input": _spec(f"features_{k}", SHAPES[k]),
                              "output": _spec(f"logits_{k}", [1, CLASSES]),
                              "onnx": f"variants/{arch_id}/exit_{k}.onnx", "consumes_segment": k})
            per_exit = [accuracy] * (exit_stage + 1)
            entries.append({"arch_id": arch_id, "exit_stage": exit_stage, "accuracy": accuracy,
                            "accuracy_per_exit": per_exit, "latency_ms": 1.0 + exit_stage, "energy": energy,
                            "memory_mb": memory[arch_id], "segments": segments, "exits": exits,
                            "preferred_engine": "onnxruntime", "engines": ["onnxruntime"]})
            index_entries.append(IndexEntry(arch_id, accuracy, 1.0 + exit_stage, energy, memory[arch_id], exit_stage,
                                            tuple(per_exit), "onnxruntime"))
        writer.write_json("bundle.json", {"version": 1, "target": {"name": "host"}, "classes": CLASSES,
                                          "input": _spec("input", INPUT_SHAPE), "variants": entries})
        writer.write_json("profile.json", {"device": "test"})
        writer.write_json("index.json", FrontIndex(index_entries).to_json_dict())
        writer.write_json("serve.json", serve if serve is not None else {})
    return out
