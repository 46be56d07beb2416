"""Moved to :mod:`hmt.graph.rewrite`; kept so imports of ``hmt.fuse.rewrite`` keep working."""

from hmt.graph.rewrite import GraphView, apply_until_fixed, attr, set_attr

__all__ = ["GraphView", "apply_until_fixed", "attr", "set_attr"]
