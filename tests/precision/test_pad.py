"""Zero-padding narrow channels (hmt.precision.pad): exact, and refused where the graph holds an unknown op."""

from __future__ import annotations

import numpy as np
import pytest


def _residual_graph(extra_op: str | None = None):
    """8 channels at 8x8: conv-relu-conv + identity, relu, then an option-A stage transition
    (stride-2 conv 8->16 beside Slice + channel Pad 4/4 of the input), GAP, Flatten, Gemm."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                       name)

    i64 = np.int64
    inits = [w("w1", 8, 8, 3, 3), w("b1", 8), w("w2", 8, 8, 3, 3), w("b2", 8), w("w3", 16, 8, 3, 3), w("b3", 16),
             w("fc", 5, 16), w("fcb", 5),
             numpy_helper.from_array(np.array([0, 0], i64), "s_start"), numpy_helper.from_array(np.array([8, 8], i64),
                                                                                               "s_end"),
             numpy_helper.from_array(np.array([2, 3], i64), "s_axes"), numpy_helper.from_array(np.array([2, 2], i64),
                                                                                              "s_step"),
             numpy_helper.from_array(np.array([0, 4, 0, 0, 0, 4, 0, 0], i64), "pads")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["c2", "x"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r2"])]
    last = "r2"
    if extra_op:
        nodes.append(helper.make_node(extra_op, ["r2"], ["odd"], name="odd"))
        last = "odd"
    nodes += [helper.make_node("Conv", [last, "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
              helper.make_node("Slice", [last, "s_start", "s_end", "s_axes", "s_step"], ["sl"]),
              helper.make_node("Pad", ["sl", "pads"], ["sc"], mode="constant"),
              helper.make_node("Add", ["c3", "sc"], ["a2"]),
              helper.make_node("Relu", ["a2"], ["r3"]),
              helper.make_node("GlobalAveragePool", ["r3"], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "res", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5]),
                               helper.make_tensor_value_info("r2", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def test_padding_is_exact_and_widens_narrow_convs() -> None:
    from onnx import numpy_helper

    from hmt.precision.pad import pad_channels

    model = _residual_graph()
    padded, report = pad_channels(model)
    assert report.padded, report.to_json()
    assert report.to_json()["widths"] == ["8->16"]
    weights = {i.name: numpy_helper.to_array(i) for i in padded.graph.initializer}
    convs = [n for n in padded.graph.node if n.op_type == "Conv"]
    assert all(weights[n.input[1]].shape[:2] == (16, 16) for n in convs)  # every conv reads and writes 16 channels
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype(np.float32)
    want, got = _run(model, x), _run(padded, x)
    assert [a.shape for a in got] == [(1, 5), (1, 8, 8, 8)]  # the padded graph output is cut back to 8 channels
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Sigmoid", "Softmax"])
def test_unknown_op_on_a_padded_tensor_leaves_the_graph_alone(op: str) -> None:
    from hmt.precision.pad import pad_channels

    model = _residual_graph(extra_op=op)
    same, report = pad_channels(model)
    assert same is model
    assert not report.padded
    assert op in report.reason and "odd" in report.reason


def test_padded_width() -> None:
    from hmt.precision.pad import padded_width

    assert [padded_width(c) for c in (3, 8, 12, 16, 18, 24, 64)] == [16, 16, 16, 16, 20, 24, 64]
