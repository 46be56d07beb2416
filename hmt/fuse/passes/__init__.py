"""Moved to :mod:`hmt.graph.passes` (the pass catalogue convert and fuse share); kept so imports
of ``hmt.fuse.passes`` keep working."""

from hmt.graph.passes import (
    FUSION_CLASSES,
    GraphPass,
    PassReport,
    apply_passes,
    fusion_pass_names,
    graph_passes,
    register_pass,
    resolve_passes,
)

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
