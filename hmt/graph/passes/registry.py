"""The registry of named ONNX graph passes; the CLI's choices are its keys.

A pass is a function ``(view: GraphView) -> int`` that rewrites the graph in place and
returns how many times it fired. It registers itself with :func:`register_pass`; the
built-in passes live one per file under ``fusion/`` and ``elimination/`` and are loaded
by name from :data:`_BUILTIN_MODULES` (no import side effects elsewhere).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Literal

from hmt.errors import UsageError
from hmt.graph.rewrite import GraphView

Category = Literal["fusion", "elimination"]
PassFn = Callable[[GraphView], int]

# The five fusion classes of CrowdHMTware III-C1, in the order they run, then the
# redundancy eliminations convert's first pass adds (CrowdHMTware III-B2).
FUSION_CLASSES = ("conv-batchnorm", "linear", "channel-wise", "element-wise", "reduction")

_BUILTIN_MODULES = (
    "hmt.graph.passes.fusion.conv_batchnorm",
    "hmt.graph.passes.fusion.linear",
    "hmt.graph.passes.fusion.channelwise",
    "hmt.graph.passes.fusion.elementwise",
    "hmt.graph.passes.fusion.reduction",
    "hmt.graph.passes.elimination.identity",
    "hmt.graph.passes.elimination.duplicate",
    "hmt.graph.passes.elimination.noop",
)


@dataclass(frozen=True)
class GraphPass:
    name: str
    category: Category
    summary: str
    apply: PassFn
    min_opset: int = 1


_REGISTRY: dict[str, GraphPass] = {}
_loaded = False


def register_pass(name: str, *, category: Category, summary: str, min_opset: int = 1) -> Callable[[PassFn], PassFn]:
    """Decorator registering a graph pass under ``name`` (unique)."""

    def decorate(fn: PassFn) -> PassFn:
        if name in _REGISTRY and _REGISTRY[name].apply is not fn:
            raise ValueError(f"graph pass {name!r} registered twice")
        _REGISTRY[name] = GraphPass(name=name, category=category, summary=summary, apply=fn, min_opset=min_opset)
        return fn

    return decorate


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        _loaded = True


def graph_passes(category: Category | None = None) -> dict[str, GraphPass]:
    """Registered passes (built-ins loaded on first call), in registration order."""
    _load_builtins()
    return {name: p for name, p in _REGISTRY.items() if category is None or p.category == category}


def fusion_pass_names() -> list[str]:
    return list(graph_passes("fusion"))


def resolve_passes(names: list[str] | None, *, category: Category | None = None) -> list[GraphPass]:
    """Passes by name (all of ``category`` when ``names`` is None); UsageError naming unknown ones."""
    available = graph_passes(category)
    if names is None:
        return list(available.values())
    unknown = [name for name in names if name not in available]
    if unknown:
        raise UsageError(f"unknown graph pass(es) {', '.join(unknown)}; choose from {', '.join(available)}")
    return [available[name] for name in names]
