"""What ``fuse`` works on and returns: a variant's graphs, the fused variant and the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.fuse.runtime import Step, chain

if TYPE_CHECKING:
    import onnx


@dataclass
class FusedGraph:
    """One graph of a variant being fused: its converted and fused models, seeded inputs and
    reference outputs, and what the passes and the memory plan reported."""

    file: str
    role: str
    index: int
    converted: onnx.ModelProto
    fused: onnx.ModelProto
    feeds: dict[str, Any]
    reference: list[Any]
    report: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FusedVariant:
    name: str
    engine: str
    latency_ms: float
    baseline_ms: float
    planned_peak_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    fired: dict[str, int]
    timings: dict[str, dict[str, Any]]

    @property
    def speedup_vs_ort_default(self) -> float:
        return self.baseline_ms / self.latency_ms if self.latency_ms > 0 else 0.0


@dataclass(frozen=True)
class FuseResult:
    out_dir: Path
    variants: tuple[FusedVariant, ...]
    report: dict[str, Any]


def timed_path(graphs: list[FusedGraph]) -> list[FusedGraph]:
    """The graphs run for one full-depth inference: the model, or every segment then the last exit."""
    if len(graphs) == 1:
        return graphs
    segments = [g for g in graphs if g.role == "segment"]
    exits = [g for g in graphs if g.role == "exit"]
    return [*segments, exits[-1]] if exits else segments


def chain_runner(steps: list[Step], path: list[FusedGraph]) -> Callable[[], list[Any]]:
    """Segment k+1 reads segment k's output, the exit reads the last segment's."""
    return chain(steps, path[0].feeds, [next(iter(g.feeds)) for g in path[1:]])
