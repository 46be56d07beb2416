"""Each graph pass on a hand-built onnx.helper graph, checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hmt.graph.model import graph_inputs, op_counts, run_ort, seeded_inputs
from hmt.graph.passes import apply_passes, fusion_pass_names, graph_passes, resolve_passes

RNG = np.random.default_rng(0)


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, inits, x_shape, y_shape, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _w(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _run_one(model: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, int]:
    out, reports = apply_passes(model, resolve_passes([name]), seed=1)
    (report,) = reports
    assert report.status in ("applied", "no-match"), report
    feeds = seeded_inputs(graph_inputs(model), seed=3)
    for ref, got in zip(run_ort(model, feeds, level="disable"), run_ort(out, feeds, level="disable"), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    return out, report.fired


def test_registry_has_the_five_fusion_classes() -> None:
    assert set(fusion_pass_names()) == {"linear", "conv-batchnorm", "element-wise", "channel-wise", "reduction"}
    assert {"identity", "duplicate", "noop"} <= set(graph_passes("elimination"))


def test_conv_batchnorm() -> None:
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], epsilon=1e-3),
    ]
    inits = [_init("W", _w(4, 3, 3, 3)), _init("B", _w(4)), _init("g", _w(4)), _init("b", _w(4)),
             _init("m", _w(4)), _init("v", np.abs(_w(4)) + 0.5)]
    out, fired = _run_one(_model(nodes, inits, [1, 3, 8, 8], [1, 4, 8, 8]), "conv-batchnorm")
    assert fired == 1 and op_counts(out) == {"Conv": 1}


def test_linear_matmul_add_and_gemm_chain_and_bn() -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["h2"]),
        helper.make_node("Gemm", ["h2", "W2", "b2"], ["h3"], transB=1),
        helper.make_node("BatchNormalization", ["h3", "g", "b", "m", "v"], ["y"]),
    ]
    inits = [_init("W1", _w(16, 8)), _init("b1", _w(8)), _init("W2", _w(4, 8)), _init("b2", _w(4)),
             _init("g", _w(4)), _init("b", _w(4)), _init("m", _w(4)), _init("v", np.abs(_w(4)) + 0.5)]
    out, fired = _run_one(_model(nodes, inits, [2, 16], [2, 4]), "linear")
    assert fired == 3 and op_counts(out) == {"Gemm": 1}


def test_channelwise_affine_pointwise_and_pad() -> None:
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        helper.make_node("Conv", ["p", "W1"], ["c1"]),
        helper.make_node("Mul", ["c1", "s"], ["m"]),
        helper.make_node("Add", ["m", "t"], ["a"]),
        helper.make_node("Conv", ["a", "W2", "B2"], ["y"]),
    ]
    inits = [_init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64)), _init("W1", _w(6, 3, 3, 3)),
             _init("s", _w(1, 6, 1, 1)), _init("t", _w(6, 1, 1)), _init("W2", _w(4, 6, 1, 1)), _init("B2", _w(4))]
    out, fired = _run_one(_model(nodes, inits, [1, 3, 8, 8], [1, 4, 8, 8]), "channel-wise")
    assert fired == 4 and op_counts(out) == {"Conv": 1}


def test_elementwise_chains() -> None:
    nodes = [
        helper.make_node("Add", ["x", "c1"], ["a"]),
        helper.make_node("Sub", ["a", "c2"], ["b"]),
        helper.make_node("Mul", ["b", "c3"], ["d"]),
        helper.make_node("Div", ["d", "c4"], ["e"]),
        helper.make_node("Relu", ["e"], ["r"]),
        helper.make_node("Clip", ["r", "lo", "hi"], ["k"]),
        helper.make_node("HardSigmoid", ["k"], ["hs"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["k", "hs"], ["y"]),
    ]
    inits = [_init("c1", _w(4, 1, 1)), _init("c2", _w(1)), _init("c3", _w(4, 1, 1)),
             _init("c4", np.array(2.0, np.float32)), _init("lo", np.array(-1.0, np.float32)),
             _init("hi", np.array(6.0, np.float32))]
    out, fired = _run_one(_model(nodes, inits, [1, 4, 5, 5], [1, 4, 5, 5]), "element-wise")
    assert fired == 4
    assert op_counts(out) == {"Add": 1, "Clip": 1, "HardSwish": 1, "Mul": 1}


def test_reduction_mean_to_gap_merge_and_pad_pool() -> None:
    nodes = [
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        helper.make_node("AveragePool", ["p"], ["q"], kernel_shape=[3, 3], strides=[1, 1]),
        helper.make_node("ReduceMax", ["q"], ["r1"], axes=[1], keepdims=1),
        helper.make_node("ReduceMax", ["r1"], ["r2"], axes=[0], keepdims=1),
        helper.make_node("ReduceMean", ["r2"], ["y"], axes=[2, 3], keepdims=0),
    ]
    inits = [_init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))]
    out, fired = _run_one(_model(nodes, inits, [2, 4, 6, 6], [1, 1], opset=17), "reduction")
    assert fired == 3
    assert op_counts(out) == {"AveragePool": 1, "Flatten": 1, "GlobalAveragePool": 1, "ReduceMax": 1}


def test_reduction_opset18_axes_input() -> None:
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)]
    inits = [_init("axes", np.array([-2, -1], dtype=np.int64))]
    out, fired = _run_one(_model(nodes, inits, [1, 3, 4, 4], [1, 3, 1, 1], opset=18), "reduction")
    assert fired == 1 and op_counts(out) == {"GlobalAveragePool": 1}


def test_eliminations() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        helper.make_node("Dropout", ["i"], ["d"]),
        helper.make_node("Add", ["d", "zero"], ["z"]),
        helper.make_node("Relu", ["z"], ["r1"]),
        helper.make_node("Relu", ["z"], ["r2"]),
        helper.make_node("Transpose", ["r1"], ["t1"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["t2"], ["k"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["k", "r2"], ["y"]),
    ]
    inits = [_init("zero", np.zeros((1,), np.float32))]
    model = _model(nodes, inits, [1, 2, 3, 3], [1, 2, 3, 3])
    out, reports = apply_passes(model, resolve_passes(["identity", "duplicate", "noop"]), seed=0)
    assert [r.status for r in reports] == ["applied"] * 3, reports
    assert op_counts(out) == {"Add": 1, "Relu": 1}


def test_pass_that_breaks_the_graph_is_rejected() -> None:
    from hmt.graph.passes.registry import GraphPass

    def wrong(view):  # scales the conv weights: outputs change
        from onnx import numpy_helper as nh

        init = view.initializers["W"]
        init.CopyFrom(nh.from_array(nh.to_array(init) * 2, "W"))
        return 1

    nodes = [helper.make_node("Conv", ["x", "W"], ["y"])]
    model = _model(nodes, [_init("W", _w(2, 3, 1, 1))], [1, 3, 4, 4], [1, 2, 4, 4])
    out, (report,) = apply_passes(model, [GraphPass("wrong", "fusion", "test", wrong)], seed=0)
    assert report.status.startswith("rejected: outputs differ")
    assert out.graph.initializer[0].SerializeToString() == model.graph.initializer[0].SerializeToString()


@pytest.mark.parametrize("name", sorted(graph_passes()))
def test_every_pass_leaves_an_unmatched_graph_alone(name: str) -> None:
    model = _model([helper.make_node("Sigmoid", ["x"], ["y"])], [], [1, 4], [1, 4])
    _, fired = _run_one(model, name)
    assert fired == 0
