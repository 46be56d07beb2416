"""Named ONNX graph passes: the five fusion classes and the redundancy eliminations."""

from hmt.graph.passes.registry import (
    FUSION_CLASSES,
    GraphPass,
    fusion_pass_names,
    graph_passes,
    register_pass,
    resolve_passes,
)
from hmt.graph.passes.runner import PassReport, apply_passes

__all__ = [
    "FUSION_CLASSES",
    "GraphPass",
    "PassReport",
    "apply_passes",
    "fusion_pass_names",
    "graph_passes",
    "register_pass",
    "resolve_passes",
]
