"""serve's names for the runtime layer (kept for callers of ``hmt.serve.running.runner``).

Loading, verification, sessions and the chain runners live in :mod:`hmt.runtime`;
:func:`load_runner` is :func:`hmt.runtime.variant.load_variant`.
"""

from __future__ import annotations

from pathlib import Path

from hmt.runtime.chain import ChainResult, ChainRunner, GraphFn, MergedChainRunner, Runner, softmax_confidence
from hmt.runtime.variant import (
    example_input,
    graph_fn,
    numpy_dtype,
    resolve_engine,
    runtime_available,
)
from hmt.runtime.variant import load_variant as load_runner


def ort_graph(path: Path, threads: int) -> GraphFn:
    """One ONNX graph file under ONNX Runtime with serve's defaults (``threads`` intra-op threads,
    no spinning), single input, first output. Not verified against a manifest: graphs of a
    bundle go through :func:`graph_fn`, which is."""
    from dataclasses import replace

    from hmt.runtime.ort import ort_session
    from hmt.runtime.variant import SERVE_DEFAULT_ORT

    return ort_session(Path(path), replace(SERVE_DEFAULT_ORT, intra_op_threads=threads), what=str(path)).graph_fn()


def tvm_graph(path: Path, threads: int) -> GraphFn:
    """One TVM library file on the CPU (not verified against a manifest; see :func:`ort_graph`)."""
    from hmt.runtime.tvm import tvm_graph_fn

    return tvm_graph_fn(Path(path), threads)

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
    "ort_graph",
    "resolve_engine",
    "runtime_available",
    "softmax_confidence",
    "tvm_graph",
]
