"""Moved to :mod:`hmt.graph.passes.registry`; kept so imports of the old path keep working."""

from hmt.graph.passes.registry import (
    FUSION_CLASSES,
    GraphPass,
    fusion_pass_names,
    graph_passes,
    register_pass,
    resolve_passes,
)

__all__ = ["FUSION_CLASSES", "GraphPass", "fusion_pass_names", "graph_passes", "register_pass", "resolve_passes"]
