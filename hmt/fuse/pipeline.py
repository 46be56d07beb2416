"""``fuse``: a converted artifact -> fused graphs, compiled modules, memory plans, engine choice.

Per variant (all its graphs: one model, or segments + exit heads):
1. the registered fusion passes, each verified against ORT on its input graph;
2. the tensor-lifetime memory plan of the fused graph;
3. candidate engines: ONNX Runtime (the converted graph with default options: the
   baseline; the fused graph with a few session settings; for a chain of several
   graphs, the chain merged into one graph, run by one ORT call) and TVM Relax
   (untuned, and tuned with MetaSchedule when asked), each checked against the
   converted graph's outputs and timed on this machine, alternating candidates in one
   loop: rounds that visit every candidate once, a burst of ``timing_burst`` calls back to
   back per visit, the first ``timing_drop`` untimed: the rate serve runs a variant at
   under load (see :mod:`hmt.fuse.engines.timing`);
4. the fastest verified candidate becomes the variant's runtime, candidates within the
   measured noise of each other being tied (:func:`hmt.fuse.choice.choose`); every timing and the
   choice go in the manifest. For segmented variants the timed path is the full chain
   (every segment, then the last exit head).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.artifacts import Artifact, ArtifactWriter
from hmt.convert.pipeline import load_converted
from hmt.convert.verify import compare
from hmt.errors import HmtError, UsageError
from hmt.fuse.choice import BASELINE, CHOICE_RULE, choice_margins, choose
from hmt.fuse.engines import ort as ort_engine
from hmt.fuse.engines.timing import (
    Timing,
    measure_alternating,
    measure_rounds,
    timing_mode,
)
from hmt.fuse.memory_plan import plan_memory
from hmt.fuse.report import fused_metrics, precision_siblings, variant_report, variant_result
from hmt.fuse.result import FusedGraph, FusedVariant, FuseResult, chain_runner, timed_path
from hmt.fuse.runtime import ort_step, tvm_step
from hmt.graph.model import check_model, graph_inputs, load_onnx, save_onnx, seeded_inputs
from hmt.graph.passes import apply_passes, fusion_pass_names, resolve_passes
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    pass

FUSED_KIND = "fused"
REPORT_NAME = "report.json"
ENGINES = ("ort", "tvm")


@dataclass(frozen=True)
class FuseOptions:
    passes: tuple[str, ...] | None = None  # None: every registered fusion pass
    engines: tuple[str, ...] = ENGINES
    device: str = "cpu"
    tune_trials: int = 0
    tuning_dir: Path | None = None
    warmup: int = 3
    # Timed calls per candidate, at least: they come in rounds of (timing_burst - timing_drop)
    # calls, at least 3 rounds (hmt.fuse.engines.timing.measure_rounds); 112 = 7 rounds of 16.
    repeats: int = 112
    seed: int = 0
    atol: float = 1e-3
    rtol: float = 1e-3
    # Two candidates whose round-by-round ratio is within the measured noise (half its
    # inter-quartile range over the rounds) or within this fraction are tied; a tie goes to
    # ORT's defaults (see choose). The floor keeps a few quiet rounds from calling 1% a win.
    tie_floor: float = 0.02
    # Calls per visit of a candidate in the timing loop: 1 times each call after a pause of
    # settle_s (an idle server's first request: thread pools asleep); k > 1 pauses, runs k
    # calls back to back, drops the first timing_drop and times the rest (serve under load),
    # in rounds that visit every candidate once (order rotated). Pausing before every call
    # measured ORT ResNet-18 b1 on a 16-core host at 5.9 ms against 1.6 ms back to back, and
    # picked TVM for it; bursts of 8 with one call dropped disagreed with an independent loop
    # by 10-20 % on close pairs (the H100 host; benchmarks/precision/results/gpu_engines.json).
    timing_burst: int = 20
    timing_drop: int = 4
    settle_s: float = 0.005
    # ORT's parallel execution mode (independent branches at once, inter-op threads) as one
    # more candidate, chosen only if it measures faster (CrowdHMTware III-C1 (2)).
    ort_parallel: bool = True
    # Peak RSS of the chosen ORT candidate in a fresh process, with ORT's memory pattern and
    # arena on (its default) and off: what the static memory plan buys (hmt.fuse.rss).
    measure_rss: bool = False


def _fuse_graph(graph: FusedGraph, options: FuseOptions) -> None:
    passes = resolve_passes(list(options.passes) if options.passes is not None else None, category="fusion")
    fused, reports = apply_passes(graph.converted, passes, seed=options.seed)
    check_model(fused, what=f"{graph.file} after fusion")
    graph.fused = fused
    plan = plan_memory(fused)
    graph.report.update({
        "passes": [r.to_json() for r in reports],
        "memory_plan": plan.summary(),
        "_plan": plan,
    })


def _variant_engines(
    writer: ArtifactWriter, name: str, graphs: list[FusedGraph], options: FuseOptions, progress: ProgressCallback,
) -> tuple[dict[str, Callable[[], list[Any]]], dict[str, Any], dict[str, str]]:
    """Build every candidate for one variant; returns (runners, per-candidate runtime config, failures)."""
    path = timed_path(graphs)
    runners: dict[str, Callable[[], list[Any]]] = {}
    runtime: dict[str, Any] = {}
    failures: dict[str, str] = {}
    # Baseline: ORT with its defaults on the converted graphs.
    base_cfg = ort_engine.OrtConfig()
    runners[BASELINE] = chain_runner([ort_step(g.converted.SerializeToString(), base_cfg, options.device)
                                       for g in path], path)
    ort_device = ort_engine.effective_device(options.device)
    runtime[BASELINE] = {"engine": "ort", "graphs": "converted", "ort": base_cfg.to_json(), "ort_device": ort_device}
    _save_portable(writer, name, graphs)
    if "ort" in options.engines:
        configs = [ort_engine.OrtConfig(), ort_engine.OrtConfig(intra_op_threads=1)]
        if options.ort_parallel:
            configs.extend(_parallel_configs(graphs, path))
        for cfg in configs:
            label = f"{cfg.name}(fused)"
            try:
                runners[label] = chain_runner([ort_step(g.report["_portable"].SerializeToString(), cfg,
                                                         options.device) for g in path], path)
                runtime[label] = {"engine": "ort", "graphs": "fused", "ort": cfg.to_json(), "ort_device": ort_device}
            except HmtError as exc:
                failures[label] = str(exc)
        if len(path) > 1:
            _add_merged_chain(writer, name, path, configs, options, runners, runtime, failures, ort_device)
        if ort_device == "cuda":
            _add_host_cpu(path, configs, runners, runtime, failures)
    if "tvm" in options.engines:
        _add_tvm(writer, name, graphs, path, options, runners, runtime, failures, progress)
    return runners, runtime, failures


def _save_portable(writer: ArtifactWriter, name: str, graphs: list[FusedGraph]) -> None:
    """Every graph's fused ONNX, whatever the engines timed: deploy bundles ONNX Runtime for
    every variant (TVM or not), so an artifact without them could not be deployed."""
    for graph in graphs:
        rel = f"{name}/{Path(graph.file).stem}.onnx"
        info = ort_engine.save_portable(graph.fused, writer.path(rel))
        portable = load_onnx(writer.path(rel))
        if info["ort_only"]:
            save_onnx(graph.fused, writer.path(rel))  # keep the hmt graph; ORT's needs ORT
            portable = graph.fused
            info = {**info, "ort_only": False, "note": "ORT's basic rewrite was not portable; hmt graph kept"}
        graph.report["onnx"] = {"file": rel, **info}
        graph.report["_portable"] = portable


def _add_host_cpu(
    path: list[FusedGraph], configs: list[ort_engine.OrtConfig], runners: dict[str, Callable[[], list[Any]]],
    runtime: dict[str, Any], failures: dict[str, str],
) -> None:
    """On a GPU device, ORT on the host's CPU as candidates too: small graphs at batch 1 run
    faster there than through CUDA kernel launches and copies, so the GPU does not win by default."""
    for cfg in configs:
        label = f"{cfg.name}(fused)@cpu"
        try:
            runners[label] = chain_runner([ort_step(g.report["_portable"].SerializeToString(), cfg, "cpu")
                                            for g in path], path)
            runtime[label] = {"engine": "ort", "graphs": "fused", "ort": cfg.to_json(), "ort_device": "cpu"}
        except HmtError as exc:
            failures[label] = str(exc)


def _parallel_configs(graphs: list[FusedGraph], path: list[FusedGraph]) -> list[ort_engine.OrtConfig]:
    """ORT's parallel mode, offered only where the timed path has parallel branches of heavy operators."""
    from hmt.convert.graph import cpu_count_physical
    from hmt.fuse.branches import parallel_width

    for graph in graphs:
        graph.report["parallel_width"] = parallel_width(graph.report["_portable"])
    width = max(g.report["parallel_width"] for g in path)
    if width < 2:
        return []  # every hand-off would cost a thread wake-up for nothing (hmt.fuse.branches)
    return [ort_engine.OrtConfig(execution_mode="parallel", inter_op_threads=min(width, max(2, cpu_count_physical())))]


def _add_merged_chain(
    writer: ArtifactWriter, name: str, path: list[FusedGraph], configs: list[ort_engine.OrtConfig],
    options: FuseOptions,
    runners: dict[str, Callable[[], list[Any]]], runtime: dict[str, Any], failures: dict[str, str], ort_device: str,
) -> None:
    """The timed path's fused graphs merged into one ONNX graph: one ORT call per inference."""
    rel = f"{name}/chain.onnx"
    try:
        merged = ort_engine.merge_chain([g.report["_portable"] for g in path])
        check_model(merged, what=f"{name}: merged chain")
        save_onnx(merged, writer.path(rel))
    except HmtError as exc:
        for cfg in configs:
            failures[f"{cfg.name}(chain)"] = str(exc)
        return
    data = merged.SerializeToString()
    # On a GPU device the host's CPU competes too (see _add_host_cpu).
    places = [(options.device, ort_device, "")] + ([("cpu", "cpu", "@cpu")] if ort_device == "cuda" else [])
    for device, where, suffix in places:
        for cfg in configs:
            label = f"{cfg.name}(chain){suffix}"
            try:
                step = ort_step(data, cfg, device)
                runners[label] = chain_runner([step], path[:1])
                runtime[label] = {"engine": "ort", "graphs": "chain", "onnx": rel, "chain": [g.file for g in path],
                                  "ort": cfg.to_json(), "ort_device": where}
            except HmtError as exc:
                failures[label] = str(exc)


def _add_tvm(
    writer: ArtifactWriter, name: str, graphs: list[FusedGraph], path: list[FusedGraph], options: FuseOptions,
    runners: dict[str, Callable[[], list[Any]]], runtime: dict[str, Any], failures: dict[str, str],
    progress: ProgressCallback,
) -> None:
    import time

    from hmt.artifacts.paths import relative_to_artifact
    from hmt.fuse.engines import tvm as tvm_engine

    try:
        target = tvm_engine.target_config(options.device)
    except HmtError as exc:
        failures["tvm"] = str(exc)
        return
    variants: list[tuple[str, Path | None]] = [("tvm", None)]
    if options.tune_trials > 0:
        tuning_dir = options.tuning_dir or (writer.out_dir.parent / "tvm-tuning")
        variants.append(("tvm-tuned", tuning_dir))
    for label, database in variants:
        libraries: dict[str, str] = {}
        compile_s = 0.0
        tuning: list[dict[str, Any]] = []
        try:
            for graph in graphs:
                mod = tvm_engine.import_onnx(graph.fused)
                if database is not None:
                    record = tvm_engine.tune(mod, target, work_dir=database, trials=options.tune_trials,
                                             seed=options.seed, progress=progress)
                    tuning.append({"graph": graph.file, **record.to_json(),
                                   "work_dir": relative_to_artifact(database, writer.out_dir)})
                t0 = time.perf_counter()
                executable = tvm_engine.compile_module(mod, target, database_dir=database)
                compile_s += time.perf_counter() - t0
                suffix = "" if label == "tvm" else ".tuned"
                rel = f"{name}/{Path(graph.file).stem}{suffix}.so"
                tvm_engine.export_library(executable, writer.path(rel))
                libraries[graph.file] = rel
            steps = [
                tvm_step(writer.path(libraries[g.file]), next(iter(g.feeds)), options.device)
                for g in path
            ]
            runners[label] = chain_runner(steps, path)
            runtime[label] = {"engine": "tvm", "target": target, "libraries": libraries,
                              "compile_s": round(compile_s, 2), "tuning": tuning or None}
        except HmtError as exc:
            failures[label] = str(exc)


def _drop(options: FuseOptions) -> int:
    """Calls dropped per burst: ``timing_drop``, but at least one call of each burst is timed."""
    return min(options.timing_drop, options.timing_burst - 1)


def _rounds(options: FuseOptions) -> int:
    return max(3, -(-options.repeats // (options.timing_burst - _drop(options))))


def _timing_mode(options: FuseOptions) -> dict[str, Any]:
    if options.timing_burst == 1:
        return timing_mode(1, options.settle_s)
    return timing_mode(options.timing_burst, options.settle_s, rounds=_rounds(options), drop=_drop(options))


def _measure(runners: dict[str, Callable[[], list[Any]]], options: FuseOptions) -> dict[str, Timing]:
    """Isolated calls for ``timing_burst`` 1, else rounds of alternating bursts (hmt.fuse.engines.timing)."""
    if options.timing_burst == 1:
        return measure_alternating(runners, warmup=options.warmup, repeats=options.repeats, burst=1,
                                   settle_s=options.settle_s)
    return measure_rounds(runners, rounds=_rounds(options), burst=options.timing_burst, drop=_drop(options),
                          warmup=options.warmup, settle_s=options.settle_s)


def _verify_candidates(runners: dict[str, Callable[[], list[Any]]], reference: list[Any],
                       options: FuseOptions) -> dict[str, dict[str, Any]]:
    checks = {}
    for label, run in list(runners.items()):
        try:
            outputs = [o if not hasattr(o, "numpy") else o.numpy() for o in run()]
            comparison = compare(label, reference, outputs, atol=options.atol, rtol=options.rtol)
            checks[label] = comparison.to_json()
            if not comparison.passed:
                del runners[label]
        except HmtError as exc:
            checks[label] = {"passed": False, "error": str(exc)}
            del runners[label]
    return checks


def _check_options(options: FuseOptions) -> None:
    """Refuse options no run can honour, before anything is read or written."""
    unknown = [e for e in options.engines if e not in ENGINES]
    if unknown:
        raise UsageError(f"unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    if options.device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {options.device!r}; choose cpu or cuda")
    if options.tune_trials < 0:
        raise UsageError("--tune-trials must be >= 0")
    if options.tune_trials and "tvm" not in options.engines:
        raise UsageError("--tune-trials needs the tvm engine")
    if options.timing_burst < 1 or options.settle_s < 0:
        raise UsageError("--burst must be >= 1 and the settle pause >= 0")
    if options.timing_drop < 1:
        raise UsageError(f"--drop must be >= 1, got {options.timing_drop}")
    if options.repeats < 1 or options.warmup < 0:  # -1 timed 3 rounds and warmed up 0 times, without a word
        raise UsageError(f"--repeats must be >= 1 and --warmup >= 0, got {options.repeats} and {options.warmup}")
    if options.tie_floor < 0:
        raise UsageError("the tie floor must be >= 0")


def _run_config(options: FuseOptions, passes: list[str], out_dir: Path | str) -> dict[str, Any]:
    """The config the artifact records (the tuning folder relative to the artifact)."""
    from hmt.artifacts.paths import relative_to_artifact

    return {
        "passes": passes, "engines": list(options.engines), "device": options.device,
        "tune_trials": options.tune_trials,
        "tuning_dir": relative_to_artifact(options.tuning_dir, out_dir) if options.tuning_dir else None,
        "warmup": options.warmup, "repeats": options.repeats, "seed": options.seed,
        "tie_floor": options.tie_floor,
        "choice_rule": CHOICE_RULE,
        "timing": _timing_mode(options),
        "atol": options.atol, "rtol": options.rtol,
        "ort_parallel": options.ort_parallel, "measure_rss": options.measure_rss,
    }


def _fuse_variant(
    writer: ArtifactWriter, artifact: Artifact, entry: dict[str, Any], options: FuseOptions,
    progress: ProgressCallback,
) -> tuple[FusedVariant, dict[str, Any]]:
    """One variant of the converted artifact: fuse and plan its graphs, build, verify and time
    every candidate, choose; returns its result and its report.json entry."""
    name = str(entry["name"])
    graphs = []
    for g in entry["graphs"]:
        model = load_onnx(artifact.file(g["file"]))
        feeds = seeded_inputs(graph_inputs(model), seed=options.seed)
        graphs.append(FusedGraph(g["file"], g["role"], int(g["index"]), model, model, feeds, []))
    for graph in graphs:
        _fuse_graph(graph, options)
    path = timed_path(graphs)
    runners, runtime, failures = _variant_engines(writer, name, graphs, options, progress)
    reference = runners[BASELINE]()
    checks = _verify_candidates(runners, reference, options)
    progress("measure", 0, 1, name)
    timings = _measure(runners, options)
    progress("measure", 1, 1, name)
    best = choose(timings, tie_floor=options.tie_floor)
    # What a runtime that runs the variant graph by graph (serve, for early exit) can
    # use: the same rule over every candidate but the merged chain.
    per_graph = choose({k: t for k, t in timings.items() if runtime[k].get("graphs") != "chain"},
                       tie_floor=options.tie_floor)
    result = variant_result(name, best, timings, graphs)
    entry_report = variant_report(entry, name, graphs, path, runtime, failures, checks, timings, best, per_graph)
    entry_report["choice"]["against_others"] = choice_margins(timings, best, tie_floor=options.tie_floor)
    if options.measure_rss:
        from hmt.fuse.rss import memory_report

        progress("peak rss", 0, 1, name)
        entry_report["memory"] = memory_report(writer, runtime[per_graph.name], path, result.planned_peak_bytes)
    for graph in graphs:
        writer.write_json(f"{name}/{Path(graph.file).stem}.memory_plan.json", graph.report["_plan"].to_json())
    return result, entry_report


def fuse_model(
    converted_dir: Path | str,
    out_dir: Path | str,
    *,
    options: FuseOptions | None = None,
    progress: ProgressCallback = no_progress,
    force: bool = False,
) -> FuseResult:
    """Fuse, plan, compile and choose an engine for every variant of a converted artifact."""
    from hmt.artifacts.outputs import check_output_dir

    options = options or FuseOptions()
    _check_options(options)
    passes = list(options.passes) if options.passes is not None else fusion_pass_names()
    resolve_passes(passes, category="fusion")
    artifact, converted = load_converted(converted_dir)
    inputs = [converted_dir]
    check_output_dir(out_dir, kind=FUSED_KIND, inputs=inputs, force=force)
    config = _run_config(options, passes, out_dir)
    results: list[FusedVariant] = []
    report_variants: list[dict[str, Any]] = []
    total = len(converted["variants"])
    with ArtifactWriter(out_dir, kind=FUSED_KIND, config=config, parents=[artifact], inputs=inputs,
                        force=force) as writer:
        for vi, entry in enumerate(converted["variants"]):
            progress("fuse", vi, total, str(entry["name"]))
            result, entry_report = _fuse_variant(writer, artifact, entry, options, progress)
            results.append(result)
            report_variants.append(entry_report)
        report = {"variants": report_variants, "device": options.device,
                  "timing": _timing_mode(options),
                  "memory_plan_status": ("predicted: hmt's tensor-lifetime plan is not executed by an engine; ORT runs "
                                         "its own (memory pattern + arena), whose peak RSS --measure-rss measures")}
        writer.write_json(REPORT_NAME, report)
        writer.metrics.update(fused_metrics(results))
        siblings = precision_siblings(results, converted["variants"])
        if siblings:
            writer.metrics["precision_vs_fp32"] = siblings
        progress("fuse", total, total, None)
    return FuseResult(Path(out_dir), tuple(results), report)


__all__ = ["ENGINES", "FUSED_KIND", "FuseOptions", "fuse_model"]
