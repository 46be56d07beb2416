"""What ``convert`` takes and produces: its options, and the graphs and variants it wrote.

Kept apart from the pipeline so the steps it calls (``hmt.convert.precision``) can name
these types without importing the pipeline that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hmt.convert.export import DEFAULT_OPSET, Exporter
from hmt.convert.passes import Folder, PassStage
from hmt.convert.verify import DEFAULT_ATOL, DEFAULT_RTOL, Comparison
from hmt.graph.model import TensorSpec


@dataclass(frozen=True)
class ConvertOptions:
    opset: int = DEFAULT_OPSET
    exporter: Exporter = "auto"
    folder: Folder = "onnxslim"
    seed: int = 0
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    # Quantised variants (ids ending .int8 / .fp16, hmt.precision): refused when they lose
    # more than this fraction against the fp32 chain on the supernet's held-out images
    # (its validation split; ``accuracy_samples`` caps them, stratified).
    max_accuracy_drop: float = 0.01
    accuracy_samples: int | None = None
    # Held-out data for that check when the supernet's own (its recorded training data, to
    # rebuild the validation split) is not on this machine, e.g. the shipped supernet.
    data_path: Path | None = None


@dataclass
class ConvertedGraph:
    file: str
    role: str  # "model", "segment" or "exit"
    index: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    exporter: str
    stages: list[PassStage]

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "role": self.role,
            "index": self.index,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "exporter": self.exporter,
            "op_counts": self.stages[-1].op_counts_after if self.stages else {},
            "passes": [s.to_json() for s in self.stages],
        }


@dataclass
class ConvertedVariant:
    name: str
    arch_id: str | None
    graphs: list[ConvertedGraph] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    precision: str = "fp32"
    quantisation: dict[str, Any] | None = None  # how it was quantised and its measured accuracy

    @property
    def max_abs_error(self) -> float:
        return max((c.max_abs_error for c in self.comparisons), default=0.0)

    @property
    def max_rel_error(self) -> float:
        return max((c.max_rel_error for c in self.comparisons), default=0.0)

    def chain(self) -> dict[str, Any] | None:
        segments = [g for g in self.graphs if g.role == "segment"]
        if not segments:
            return None
        exits = [g for g in self.graphs if g.role == "exit"]
        return {
            "segments": [
                {"index": g.index, "file": g.file, "input": g.inputs[0].to_json(), "output": g.outputs[0].to_json(),
                 "reads": "model input" if g.index == 0 else f"segment {g.index - 1} output"}
                for g in segments
            ],
            "exits": [
                {"index": g.index, "file": g.file, "consumes_segment": g.index, "input": g.inputs[0].to_json(),
                 "output": g.outputs[0].to_json()}
                for g in exits
            ],
            "run": "x -> segment_0 -> ... -> segment_i -> exit_i; stop after any i",
        }

    def to_json(self) -> dict[str, Any]:
        nodes_before = sum(sum(g.stages[0].op_counts_before.values()) for g in self.graphs if g.stages)
        nodes_after = sum(sum(g.stages[-1].op_counts_after.values()) for g in self.graphs if g.stages)
        return {
            "name": self.name,
            "arch_id": self.arch_id,
            "folder": self.name,
            "graphs": [g.to_json() for g in self.graphs],
            "chain": self.chain(),
            "verification": [c.to_json() for c in self.comparisons],
            "max_abs_error": float(f"{self.max_abs_error:.6g}"),
            "max_rel_error": float(f"{self.max_rel_error:.6g}"),
            "nodes_before": nodes_before,
            "nodes_after": nodes_after,
            "precision": self.precision,
            **({"quantisation": self.quantisation} if self.quantisation is not None else {}),
        }


@dataclass(frozen=True)
class ConvertResult:
    out_dir: Path
    variants: tuple[ConvertedVariant, ...]
    report: dict[str, Any]


__all__ = ["ConvertOptions", "ConvertResult", "ConvertedGraph", "ConvertedVariant"]
