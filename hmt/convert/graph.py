"""Moved to :mod:`hmt.graph.model` (below both convert and fuse, which share it); kept so imports
of ``hmt.convert.graph`` keep working."""

from hmt.graph.model import (
    TensorSpec,
    check_model,
    constant_node_count,
    constant_node_names,
    cpu_count_physical,
    graph_inputs,
    graph_outputs,
    iter_tensors,
    load_onnx,
    op_counts,
    ort_optimization_level,
    ort_session,
    run_ort,
    save_onnx,
    seeded_inputs,
    unknown_ops,
)

__all__ = [
    "TensorSpec",
    "check_model",
    "constant_node_count",
    "constant_node_names",
    "cpu_count_physical",
    "graph_inputs",
    "graph_outputs",
    "iter_tensors",
    "load_onnx",
    "op_counts",
    "ort_optimization_level",
    "ort_session",
    "run_ort",
    "save_onnx",
    "seeded_inputs",
    "unknown_ops",
]
