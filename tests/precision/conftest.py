"""A tiny two-exit ONNX chain built with onnx.helper (no torch), and data it classifies."""

from __future__ import annotations

import numpy as np
import pytest


def _conv_segment(name: str, in_name: str, out_name: str, c_in: int, c_out: int, rng: np.random.Generator):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((rng.standard_normal((c_out, c_in, 3, 3)) / np.sqrt(9 * c_in)).astype(np.float32),
                                f"{name}_w")
    b = numpy_helper.from_array((0.1 * rng.standard_normal(c_out)).astype(np.float32), f"{name}_b")
    nodes = [helper.make_node("Conv", [in_name, w.name, b.name], [f"{name}_conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [f"{name}_conv"], [out_name])]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(in_name, TensorProto.FLOAT,
                                                                          [1, c_in, 8, 8])],
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [1, c_out, 8, 8])],
                              initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # onnx's newest IR version can be newer than what the installed ORT reads (onnx 1.23 writes
    # IR 14, onnxruntime-gpu 1.31 reads up to 13): what the torch exporter writes, IR 10, loads on both.
    model.ir_version = 10
    return model


def _exit_head(name: str, in_name: str, out_name: str, c_in: int, classes: int, rng: np.random.Generator):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((classes, c_in)).astype(np.float32), f"{name}_w")
    b = numpy_helper.from_array(np.zeros(classes, np.float32), f"{name}_b")
    nodes = [helper.make_node("GlobalAveragePool", [in_name], [f"{name}_pool"]),
             helper.make_node("Flatten", [f"{name}_pool"], [f"{name}_flat"]),
             helper.make_node("Gemm", [f"{name}_flat", w.name, b.name], [out_name], transB=1)]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(in_name, TensorProto.FLOAT,
                                                                          [1, c_in, 8, 8])],
                              [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, [1, classes])],
                              initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # onnx's newest IR version can be newer than what the installed ORT reads (onnx 1.23 writes
    # IR 14, onnxruntime-gpu 1.31 reads up to 13): what the torch exporter writes, IR 10, loads on both.
    model.ir_version = 10
    return model


@pytest.fixture(scope="session")
def tiny_chain():
    """(segments, exits) of a 2-segment chain: 3 -> 8 -> 8 channels on 8x8 inputs, 4 classes."""
    rng = np.random.default_rng(0)
    segments = [_conv_segment("s0", "input", "features_0", 3, 8, rng),
                _conv_segment("s1", "features_0", "features_1", 8, 8, rng)]
    exits = [_exit_head("e0", "features_0", "logits_0", 8, 4, rng),
             _exit_head("e1", "features_1", "logits_1", 8, 4, rng)]
    return segments, exits


@pytest.fixture(scope="session")
def tiny_data(tiny_chain):
    """Inputs and labels: the labels are the float chain's own last-exit predictions, so fp32 scores 100%."""
    from hmt.precision.quantize import float_features

    segments, exits = tiny_chain
    rng = np.random.default_rng(1)
    x = rng.standard_normal((96, 3, 8, 8)).astype(np.float32)
    feats = float_features(segments[1], float_features(segments[0], [xi[None] for xi in x]))
    logits = float_features(exits[1], feats)
    y = np.array([int(np.argmax(v[0])) for v in logits])
    return x, y
