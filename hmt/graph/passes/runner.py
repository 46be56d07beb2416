"""Run graph passes one after another, each verified against ONNX Runtime.

After a pass fires, the rewritten graph must pass ``onnx.checker`` and give the same
outputs as the graph before it on seeded inputs (ORT with its own optimisations off, so
the comparison checks the rewrite, not ORT). A pass that fails either check is rolled
back and reported as rejected; the run goes on with the other passes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hmt.compat import strict_zip
from hmt.errors import HmtError
from hmt.graph.model import graph_inputs, op_counts, run_ort, seeded_inputs
from hmt.graph.passes.registry import GraphPass
from hmt.graph.rewrite import GraphView

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class PassReport:
    name: str
    category: str
    fired: int
    status: str  # "applied", "no-match", "rejected: <why>", "skipped: <why>"
    nodes_before: int
    nodes_after: int
    max_abs_error: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _max_error(reference: list[Any], candidate: list[Any]) -> tuple[float, float]:
    import numpy as np

    worst_abs, worst_scale = 0.0, 0.0
    for ref, out in strict_zip(reference, candidate):
        if ref.shape != out.shape:
            return float("inf"), 1.0
        if ref.size:
            worst_abs = max(worst_abs, float(np.max(np.abs(ref.astype(np.float64) - out.astype(np.float64)))))
            worst_scale = max(worst_scale, float(np.max(np.abs(ref.astype(np.float64)))))
    return worst_abs, worst_scale


def apply_passes(
    model: onnx.ModelProto,
    passes: list[GraphPass],
    *,
    seed: int = 0,
    verify: bool = True,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> tuple[onnx.ModelProto, list[PassReport]]:
    """Apply ``passes`` in order to a copy of ``model``; returns the new model and one report per pass."""
    import onnx

    current = onnx.ModelProto()
    current.CopyFrom(model)
    feeds = seeded_inputs(graph_inputs(current), seed=seed) if verify else {}
    reference = run_ort(current, feeds, level="disable") if verify else []
    reports = []
    for graph_pass in passes:
        before = len(current.graph.node)
        opset = next((e.version for e in current.opset_import if e.domain in ("", "ai.onnx")), 1)
        if opset < graph_pass.min_opset:
            reports.append(PassReport(graph_pass.name, graph_pass.category, 0, f"skipped: needs opset "
                                      f"{graph_pass.min_opset}, model has {opset}", before, before, None))
            continue
        candidate = onnx.ModelProto()
        candidate.CopyFrom(current)
        view = GraphView(candidate)
        fired = graph_pass.apply(view)
        if fired == 0:
            reports.append(PassReport(graph_pass.name, graph_pass.category, 0, "no-match", before, before, None))
            continue
        view.prune()
        error: float | None = None
        if verify:
            try:
                onnx.checker.check_model(candidate, full_check=True)
                outputs = run_ort(candidate, feeds, level="disable")
            except (HmtError, onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
                reports.append(PassReport(graph_pass.name, graph_pass.category, fired,
                                          f"rejected: {str(exc).splitlines()[0][:200]}", before, before, None))
                continue
            error, scale = _max_error(reference, outputs)
            if error > atol + rtol * scale:
                reports.append(PassReport(graph_pass.name, graph_pass.category, fired,
                                          f"rejected: outputs differ by {error:.3g}", before, before, error))
                continue
        current = candidate
        reports.append(PassReport(graph_pass.name, graph_pass.category, fired, "applied", before,
                                  len(current.graph.node), error))
    return current, reports


def counts_delta(before: onnx.ModelProto, after: onnx.ModelProto) -> dict[str, dict[str, int]]:
    return {"before": op_counts(before), "after": op_counts(after)}
