"""What a fuse run records: each variant's result and report.json entry, and the run's metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hmt.fuse.choice import BASELINE
from hmt.fuse.engines.timing import Timing
from hmt.fuse.result import FusedGraph, FusedVariant, timed_path


def fused_metrics(results: list[FusedVariant]) -> dict[str, Any]:
    """The artifact's metrics: per variant, the chosen engine, its latency against ORT's defaults
    and the memory plan's bytes."""
    return {
        "variants": len(results),
        "per_variant": {
            r.name: {"engine": r.engine, "latency_ms": round(r.latency_ms, 4),
                     "ort_default_ms": round(r.baseline_ms, 4),
                     "speedup_vs_ort_default": round(r.speedup_vs_ort_default, 3),
                     "planned_peak_bytes": r.planned_peak_bytes, "naive_bytes": r.naive_bytes,
                     "lower_bound_bytes": r.lower_bound_bytes, "fired": r.fired}
            for r in results
        },
    }


def precision_siblings(results: list[FusedVariant], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each quantised variant against its fp32 sibling fused in the same run: the chosen engines' medians."""
    from hmt.precision import split_variant_id

    by_id = {str(e.get("arch_id") or e["name"]): r for e, r in zip(entries, results, strict=True)}
    out: dict[str, Any] = {}
    for vid, result in by_id.items():
        base, precision = split_variant_id(vid)
        if precision != "fp32" and base in by_id:
            out[vid] = {"precision": precision, "fp32": base, "latency_ms": round(result.latency_ms, 4),
                        "fp32_latency_ms": round(by_id[base].latency_ms, 4),
                        "speedup_vs_fp32": round(by_id[base].latency_ms / result.latency_ms, 3)}
    return out


def variant_result(name: str, best: Timing, timings: dict[str, Timing], graphs: list[FusedGraph]) -> FusedVariant:
    """The variant's result: the chosen candidate's median, ORT's defaults', the passes that fired
    and the memory plan over one full-depth run."""
    fired: dict[str, int] = {}
    for graph in graphs:
        for r in graph.report["passes"]:
            if r["status"] == "applied":
                fired[r["name"]] = fired.get(r["name"], 0) + r["fired"]
    # Variant level, over the graphs of one full-depth run (they run one after another, so
    # one arena of the largest graph's plan serves them all; naive gives every tensor of
    # every graph its own buffer).
    plans = [graph.report["_plan"] for graph in timed_path(graphs)]
    return FusedVariant(
        name=name,
        engine=best.name,
        latency_ms=best.median_ms,
        baseline_ms=timings[BASELINE].median_ms,
        planned_peak_bytes=max(p.planned_peak_bytes for p in plans),
        naive_bytes=sum(p.naive_bytes for p in plans),
        lower_bound_bytes=max(p.lower_bound_bytes for p in plans),
        fired=fired,
        timings={k: v.to_json() for k, v in timings.items()},
    )


def variant_report(entry: dict[str, Any], name: str, graphs: list[FusedGraph], path: list[FusedGraph],
                    runtime: dict[str, Any], failures: dict[str, str], checks: dict[str, Any],
                    timings: dict[str, Timing], best: Timing, per_graph: Timing) -> dict[str, Any]:
    """The variant's entry in report.json: its graphs, every candidate with its verification and
    timing, those unavailable, and the choice (whole chain, and graph by graph)."""
    return {
        "name": name,
        "arch_id": entry.get("arch_id"),
        "chain": entry.get("chain"),
        "timed_path": [g.file for g in path],
        "graphs": [
            {"file": g.file, "role": g.role, "index": g.index, "input_name": next(iter(g.feeds)),
             **{k: v for k, v in g.report.items() if not k.startswith("_")},
             "memory_plan_file": f"{name}/{Path(g.file).stem}.memory_plan.json"}
            for g in graphs
        ],
        "candidates": {label: {**runtime.get(label, {}), "verification": checks.get(label),
                               "timing": timings[label].to_json() if label in timings else None}
                       for label in runtime},
        "unavailable": failures,
        "choice": {"candidate": best.name, **runtime[best.name], "median_ms": round(best.median_ms, 4),
                   "ort_default_ms": round(timings[BASELINE].median_ms, 4),
                   "speedup_vs_ort_default": round(timings[BASELINE].median_ms / best.median_ms, 3)},
        "choice_per_graph": {"candidate": per_graph.name, **runtime[per_graph.name],
                             "median_ms": round(per_graph.median_ms, 4),
                             "speedup_vs_ort_default": round(timings[BASELINE].median_ms / per_graph.median_ms, 3)},
    }


__all__ = ["fused_metrics", "precision_siblings", "variant_report", "variant_result"]
