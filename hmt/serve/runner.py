"""serve's names for the runtime layer (kept for callers of ``hmt.serve.runner``).

Loading, verification, sessions and the chain runners live in :mod:`hmt.runtime`;
:func:`load_runner` is :func:`hmt.runtime.variant.load_variant`.
"""

from __future__ import annotations

from hmt.runtime.chain import ChainResult, ChainRunner, GraphFn, MergedChainRunner, Runner, softmax_confidence
from hmt.runtime.variant import (
    example_input,
    graph_fn,
    numpy_dtype,
    resolve_engine,
    runtime_available,
)
from hmt.runtime.variant import load_variant as load_runner

__all__ = [
    "ChainResult",
    "ChainRunner",
    "GraphFn",
    "MergedChainRunner",
    "Runner",
    "example_input",
    "graph_fn",
    "load_runner",
    "numpy_dtype",
    "resolve_engine",
    "runtime_available",
    "softmax_confidence",
]
