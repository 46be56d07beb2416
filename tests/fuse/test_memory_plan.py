"""The tensor-lifetime memory plan on graphs with known answers."""

from __future__ import annotations

import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from hmt.fuse.memory_plan import TensorLifetime, live_set_lower_bound, plan_arena, plan_memory


def _diamond() -> onnx.ModelProto:
    # x -> a=Relu(x) -> b=Relu(a) -> y=Add(a, b); every tensor is 1x100 float32 = 400 bytes.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 100])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 100])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_diamond_exact_peak() -> None:
    plan = plan_memory(_diamond(), alignment=1)
    # lifetimes: x [0,0], a [0,2], b [1,2], y [2,2]; live sets 800, 800, 1200
    assert plan.naive_bytes == 1600
    assert plan.lower_bound_bytes == 1200
    assert plan.planned_peak_bytes == 1200
    offsets = {t.name: t.offset_bytes for t in plan.tensors}
    assert offsets["b"] == offsets["x"]  # b reuses x's block once x is dead


def test_chain_reuses_two_buffers() -> None:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(6)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("t6", TensorProto.FLOAT, [1, 16])])
    plan = plan_memory(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert plan.naive_bytes == 7 * 64
    assert plan.planned_peak_bytes == plan.lower_bound_bytes == 2 * 64
    assert plan.planned_over_naive <= 0.5


def test_best_fit_takes_the_smallest_gap() -> None:
    lifetimes = [
        TensorLifetime("big", 1000, 0, 1), TensorLifetime("mid", 300, 0, 3), TensorLifetime("keep", 200, 2, 3),
        TensorLifetime("small", 100, 2, 2),
    ]
    plan = plan_arena(lifetimes, steps=4, alignment=1)
    placed = {t.name: t for t in plan.tensors}
    assert placed["keep"].offset_bytes == 0 and placed["small"].offset_bytes == 200
    assert plan.planned_peak_bytes == plan.lower_bound_bytes == 1300


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=25))
def test_plan_is_valid_and_within_bounds(raw: list[tuple[int, int, int]]) -> None:
    lifetimes = [TensorLifetime(f"t{i}", size, min(a, b), max(a, b)) for i, (size, a, b) in enumerate(raw)]
    plan = plan_arena(lifetimes, steps=10, alignment=64)
    for i, p in enumerate(plan.tensors):
        for q in plan.tensors[i + 1:]:
            if p.first_step <= q.last_step and q.first_step <= p.last_step:
                p_end = p.offset_bytes + -(-p.size_bytes // 64) * 64
                q_end = q.offset_bytes + -(-q.size_bytes // 64) * 64
                assert p_end <= q.offset_bytes or q_end <= p.offset_bytes, (p, q)
    assert live_set_lower_bound(lifetimes, 10, alignment=64) <= plan.planned_peak_bytes
    assert plan.planned_peak_bytes <= sum(-(-t.size_bytes // 64) * 64 for t in lifetimes)


def test_an_int8_graphs_dequantized_weights_are_not_planned_as_activations() -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from hmt.fuse.memory_plan import tensor_lifetimes

    weight = numpy_helper.from_array(np.ones((64, 4, 3, 3), dtype=np.int8), "w_q")
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "w_scale")
    zero = numpy_helper.from_array(np.array(0, dtype=np.int8), "w_zero")
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w"]),
             helper.make_node("Constant", [], ["bias"], value=numpy_helper.from_array(np.zeros(64, np.float32))),
             helper.make_node("Conv", ["x", "w", "bias"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8])],
                              initializer=[weight, scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    lifetimes, steps = tensor_lifetimes(model)
    assert sorted(t.name for t in lifetimes) == ["x", "y"] and steps == 1
