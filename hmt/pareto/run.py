"""``find_front``: the pareto stage end to end, from a supernet and a profile to an artifact.

supernet + profile -> block costs -> predictor (block table or eq. 2 / eq. 1) -> budget
pre-check -> held-out batches -> search (prefix-reuse evaluation) -> front, index, answers
per budget, plot -> one atomic artifact write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hmt.errors import BudgetError, InputError, UsageError
from hmt.pareto.budgets import BudgetSweep, describe
from hmt.pareto.front import budget_excess, closest_to_budgets, hypervolume
from hmt.pareto.index import FrontIndex, IndexEntry
from hmt.pareto.objectives import COST_METRICS
from hmt.pareto.precision import PrecisionOptions
from hmt.pareto.records import Record, SearchOptions, SearchResult
from hmt.pareto.search import minimise_metric, run_search
from hmt.progress import ProgressCallback, no_progress


@dataclass(frozen=True)
class ParetoOptions:
    budgets: BudgetSweep = field(default_factory=BudgetSweep)
    # "auto": the variants a specialized supernet lists, else the nearby search (hmt.pareto.candidates)
    search: SearchOptions = field(default_factory=lambda: SearchOptions(method="auto"))
    data_path: Path | None = None  # the "edge" data; None: the supernet's validation split
    data_split: str = "test"
    max_eval_samples: int | None = None
    batch_size: int = 256
    cache_mb: float = 256.0  # bound of the cross-generation feature cache
    device: str = "cpu"
    use_block_table: bool = True
    cache_dir: Path | None = None  # decoded-dataset cache
    threads: int | None = None  # torch intra-op threads while evaluating (None: torch's default)
    calibration_samples: int | None = None  # BN re-estimation on the first N stored samples (None: all)
    # The precision gene (hmt.pareto.precision): quantised copies of the fp32 front compete.
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)

    offload_link: str | None = None  # "BW_MBIT_S,RTT_MS[,PEER_SPEEDUP[,CODEC]]": price each variant at its best cut
    # Method "listed" (or "auto") evaluates the variants of this CSV; None: the supernet's variants.csv
    candidates_path: Path | None = None

    def validate(self) -> ParetoOptions:
        self.search.validate()
        self.precision.validate()
        if self.batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {self.batch_size}")
        if not (self.cache_mb >= 0 and math.isfinite(self.cache_mb)):
            raise UsageError(f"feature cache must be a finite number >= 0 MB, got {self.cache_mb}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"threads must be >= 1, got {self.threads}")
        if self.candidates_path is not None and self.search.method not in ("auto", "listed"):
            raise UsageError(f"--candidates lists the variants to evaluate; --method {self.search.method} searches "
                             "the whole space (leave --method out, or pass --method listed)")
        if self.offload_link is not None:
            from hmt.pareto.offload import OffloadCostModel

            OffloadCostModel.parse_link(self.offload_link)  # refuse a bad link before loading anything
        return self

    def to_json_dict(self, out_dir: Path | str | None = None) -> dict[str, Any]:
        """As a manifest records them; with ``out_dir``, paths relative to it (no path of this machine)."""
        from hmt.artifacts.paths import relative_to_artifact

        def where(path: Path | None) -> str | None:
            if path is None:
                return None
            return relative_to_artifact(path, out_dir) if out_dir is not None else str(path)

        data = dataclasses.asdict(self)
        data["budgets"] = self.budgets.to_json_dict()
        data["search"] = dataclasses.asdict(self.search) | {"objectives": list(self.search.objectives)}
        data["precision"] = dataclasses.asdict(self.precision) | {"precisions": list(self.precision.precisions)}
        data["data_path"] = where(self.data_path)
        data["cache_dir"] = where(self.cache_dir)
        data["candidates_path"] = where(self.candidates_path)
        return data


@dataclass(frozen=True)
class BudgetAnswer:
    budgets: dict[str, float]
    point: dict[str, Any] | None  # the most accurate front point within them
    closest: dict[str, Any] | None  # when none: the evaluated variant that misses them least

    def to_json_dict(self) -> dict[str, Any]:
        return {"budgets": self.budgets, "arch_id": self.point["arch_id"] if self.point else None,
                "accuracy": self.point["accuracy"] if self.point else None, "closest": self.closest}


@dataclass
class ParetoRun:
    out: Path
    points: list[dict[str, Any]]
    answers: list[BudgetAnswer]
    result: SearchResult
    metrics: dict[str, Any]
    energy_unit: str
    notes: list[str]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _point(record: Record, device_id: str) -> dict[str, Any]:
    arch = record.candidate
    return {
        **arch.to_json_dict(),
        "accuracy": record.accuracy.accuracy,
        "accuracy_per_exit": list(record.accuracy.accuracy_per_exit),
        **record.costs.to_json_dict(),
        "predicted_for": device_id,
        "evaluation_order": record.order,
        "derived_from": record.derived_from,
    }


def _miss(record: Record, budgets: dict[str, float]) -> dict[str, Any]:
    excess = budget_excess(record.costs.to_json_dict(), budgets)
    return {"arch_id": record.candidate.arch.arch_id, "accuracy": record.accuracy.accuracy,
            **{m: record.costs.metric(m) for m in COST_METRICS}, "excess": excess}


def _budget_error(what: str, arch_id: str, values: dict[str, float], budgets: dict[str, float], unit: str) -> str:
    excess = budget_excess(values, budgets)
    parts = [f"{m} {values[m]:.4g} is {100 * e:.1f}% over {budgets[m]:g}" for m, e in excess.items()]
    return (f"no variant meets {describe(budgets, unit)}: {what} is {arch_id} ({'; '.join(parts)}); "
            "loosen the budgets or profile a faster engine")


def precheck_budgets(encoding: Any, costs: Any, budgets: BudgetSweep) -> None:
    """Refuse budgets nothing in the space can meet, before any evaluation."""
    limits = budgets.limits()
    for metric, limit in limits.items():
        candidate, best = minimise_metric(encoding, costs, metric)
        if best.metric(metric) > limit:
            values = {m: best.metric(m) for m in COST_METRICS}
            raise BudgetError(_budget_error(f"the variant of least {metric} found", candidate.arch.arch_id,
                                            values, {metric: limit}, costs.energy_unit))


def check_inputs(supernet: Path | str, profile: Path | str, out: Path | str, options: ParetoOptions, *,
                 force: bool = False) -> None:
    """Refuse, before any work, a missing or wrong input and an output path that is not hmt's to replace."""
    from hmt.artifacts import load_artifact
    from hmt.artifacts.outputs import check_output_dir
    from hmt.pareto.artifact import KIND
    from hmt.profile.schema import ARTIFACT_KIND
    from hmt.supernet.artifact import KIND as SUPERNET_KIND

    if options.precision.extra:  # a usage error first: fp16 needs a GPU provider to be timed
        from hmt.pareto.precision import check_device

        check_device(options.precision, options.device)
    load_artifact(supernet, kind=SUPERNET_KIND, verify_checksums=False)
    profile = Path(profile)
    if not profile.exists():
        raise InputError(f"--profile {profile}: does not exist; expected a profile-device artifact directory or a "
                         "profiles/*.json file")
    if profile.is_dir():
        load_artifact(profile, kind=ARTIFACT_KIND, verify_checksums=False)
    if options.candidates_path is not None and not Path(options.candidates_path).is_file():
        raise InputError(f"--candidates {options.candidates_path}: no such file; expected a CSV of variants "
                         "(a variants.csv or a front CSV)")
    inputs = [p for p in (supernet, profile, options.data_path, options.candidates_path) if p]
    check_output_dir(out, kind=KIND, inputs=inputs, force=force)


def find_front(supernet: Path | str, profile: Path | str, out: Path | str, options: ParetoOptions | None = None,
               *, progress: ProgressCallback = no_progress, force: bool = False) -> ParetoRun:
    """Search the supernet for its accuracy / latency / energy / memory front on a device."""
    import torch

    options = (options or ParetoOptions()).validate()
    check_inputs(supernet, profile, out, options, force=force)
    threads_before = torch.get_num_threads()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    try:
        return _find_front(Path(supernet), Path(profile), Path(out), options, progress, force)
    finally:
        torch.set_num_threads(threads_before)


@dataclass
class _Searched:
    """What the search stage of :func:`find_front` leaves for the front and its artifact."""

    options: ParetoOptions
    loaded: Any  # the supernet (hmt.supernet.LoadedSupernet)
    device_profile: Any
    predictor: Any  # ProfilePredictor
    costs: Any  # VariantCostModel, or OffloadCostModel around it
    data: Any  # the held-out data the variants were evaluated on
    calibration: Any
    result: SearchResult
    expansion: Any  # the precision expansion (None: fp32 only)
    fp32_front: list[Record]  # the front before the precision expansion
    notes: list[str]


def _search(supernet: Path, profile: Path, options: ParetoOptions, progress: ProgressCallback) -> _Searched:
    """Load the supernet and the profile, price every block, search, and add the precisions."""
    from hmt.pareto.candidates import resolve_search
    from hmt.pareto.data import calibration_batches, device_batches, held_out_data
    from hmt.pareto.encoding import Encoding
    from hmt.pareto.evaluate import PrefixEvaluator
    from hmt.pareto.objectives import ProfilePredictor, VariantCostModel, measure_block_costs
    from hmt.profile import load_profile
    from hmt.supernet import load_supernet

    if options.precision.extra:  # before any work: fp16 needs a GPU provider to be timed
        from hmt.pareto.precision import check_device

        check_device(options.precision, options.device)
    loaded = load_supernet(supernet, device=options.device)
    search_options, search_note = resolve_search(options.search, loaded, options.candidates_path)
    options = dataclasses.replace(options, search=search_options)
    device_profile = load_profile(profile)
    progress("block costs", 0, None, "measuring every block choice once")
    blocks = measure_block_costs(loaded.net)
    predictor = ProfilePredictor(device_profile, blocks, loaded.space, use_block_table=options.use_block_table)
    if options.budgets.energy and predictor.energy_unit != "mJ":
        raise UsageError(f"profile {device_profile.name!r} has an uncalibrated energy model (unit "
                         f"{predictor.energy_unit}); --energy-mj needs a profile calibrated with a power source")
    costs = VariantCostModel(loaded.net, blocks, predictor)
    if options.offload_link is not None:
        from hmt.pareto.offload import OffloadCostModel

        costs = OffloadCostModel(costs, OffloadCostModel.parse_link(options.offload_link))
    encoding = Encoding(loaded.space, choice_order=costs.choice_order(loaded.space),
                        engines=(str(device_profile.doc["device"].get("engine") or "default"),))
    precheck_budgets(encoding, costs, options.budgets)

    data = held_out_data(loaded, data_path=options.data_path, split=options.data_split,
                         max_samples=options.max_eval_samples, seed=options.search.seed, cache_dir=options.cache_dir)
    batches = device_batches(data, batch_size=options.batch_size, device=options.device)
    calibration = calibration_batches(loaded, device=options.device, max_samples=options.calibration_samples)
    evaluator = PrefixEvaluator(loaded.net, batches, calibration=calibration, cache_bytes=int(options.cache_mb * 1e6))
    result = run_search(encoding, costs, evaluator, options.budgets, options.search, progress=progress)
    fp32_front = [result.records[i] for i in result.front]
    expansion = None
    if options.precision.extra and result.records:
        from hmt.pareto.precision import expand_precisions

        expansion = expand_precisions(supernet, result, data, options.precision, device=options.device,
                                      progress=progress)
    if not result.records:
        _raise_nothing_found(result, costs, options.budgets.limits())
    return _Searched(options, loaded, device_profile, predictor, costs, data, calibration, result, expansion,
                     fp32_front, [search_note] if search_note else [])


def _raise_nothing_found(result: SearchResult, costs: Any, limits: dict[str, float]) -> None:
    closest = result.extras.get("closest_infeasible")
    if closest is None:
        raise BudgetError(f"no variant within {describe(limits, costs.energy_unit)} was found in "
                          f"{result.priced} candidates ({result.stop_reason}); loosen the budgets")
    candidate, miss = closest
    raise BudgetError(_budget_error(f"after {result.priced} candidates ({result.stop_reason}) the closest",
                                    candidate.arch.arch_id, {m: miss.metric(m) for m in COST_METRICS}, limits,
                                    costs.energy_unit))


def _front_points(s: _Searched, front_records: list[Record]) -> tuple[list[dict[str, Any]], FrontIndex]:
    """The front's points (predicted for the profiled device) and their runtime index."""
    device_id = s.device_profile.device_id
    points = [_point(r, device_id) for r in front_records]
    if hasattr(s.costs, "candidate"):  # an OffloadCostModel: each point's best cut for the link
        points = [p | {"offload_cut": s.costs.candidate(r.candidate).offload_cut}
                  for p, r in zip(points, front_records, strict=True)]
    index = FrontIndex(
        [IndexEntry(p["arch_id"], p["accuracy"], p["latency_ms"], p["energy"], p["memory_mb"], p["exit_stage"],
                    tuple(p["accuracy_per_exit"]), p["engine"]) for p in points],
        units={"accuracy": "fraction", "latency_ms": "ms", "energy": s.costs.energy_unit, "memory_mb": "MB"},
        meta={"space_tag": s.loaded.space.tag, "predicted_for": device_id,
              "objectives": list(s.options.search.objectives)},
    )
    return points, index


def _answers(s: _Searched, points: list[dict[str, Any]], index: FrontIndex) -> list[BudgetAnswer]:
    """Per budget combination: the most accurate front point within it, else the closest miss."""
    by_id = {p["arch_id"]: p for p in points}
    answers = []
    for combo in s.options.budgets.combos():
        entry = index.best_within(**combo)
        closest = None
        if entry is None:
            miss = closest_to_budgets([r.costs.to_json_dict() for r in s.result.records], combo)
            closest = _miss(s.result.records[miss.index], combo) if miss else None
        answers.append(BudgetAnswer(combo, by_id[entry.arch_id] if entry else None, closest))
    return answers


def _metrics(s: _Searched, points: list[dict[str, Any]], front_records: list[Record],
             answers: list[BudgetAnswer]) -> dict[str, Any]:
    result = s.result
    hv_ref_latency = max(s.options.budgets.limits().get("latency_ms", 0.0),
                         max(r.costs.latency_ms for r in result.records)) * 1.1
    hv = hypervolume([[-r.accuracy.accuracy, r.costs.latency_ms] for r in front_records], [0.0, hv_ref_latency])
    stats = result.eval_stats.to_json_dict()
    metrics: dict[str, Any] = {
        "front_size": len(points), "evaluations": result.evaluations, "archive_size": len(result.records),
        "generations": result.generations,
        "priced": result.priced, "infeasible": result.infeasible, "stop_reason": result.stop_reason,
        "search_wall_s": result.wall_s, "eval_wall_s": stats["wall_s"],
        "block_evals": stats["block_evals"] + stats["calib_block_evals"],
        "block_evals_plain": stats["block_evals_plain"] + stats["calib_block_evals_plain"],
        "reuse_saved_fraction": stats["saved_fraction"],
        "best_accuracy": max(p["accuracy"] for p in points),
        "hypervolume_acc_latency": hv, "hypervolume_reference": {"accuracy": 0.0, "latency_ms": hv_ref_latency},
        "budgets_met": sum(a.point is not None for a in answers), "budget_combos": len(answers),
    }
    if s.expansion is not None:
        hv_fp32 = hypervolume([[-r.accuracy.accuracy, r.costs.latency_ms] for r in s.fp32_front],
                              [0.0, hv_ref_latency])
        metrics.update({"hypervolume_acc_latency_fp32_only": hv_fp32,
                        "hypervolume_gain_from_precision": hv / hv_fp32 - 1.0 if hv_fp32 > 0 else None,
                        "precision_variants_admitted": len(s.expansion.records),
                        "precision_variants_on_front": sum(r.candidate.precision != "fp32" for r in front_records)})
    return metrics


def _notes(s: _Searched, answers: list[BudgetAnswer]) -> list[str]:
    """What a reader of the front must know about how it was obtained."""
    notes = list(s.notes)
    if s.calibration is None:
        notes.append("the supernet stores no calibration set: variants ran with the supernet's shared BN "
                     "statistics, which underestimate most subnets' accuracy")
    if s.predictor.energy_unit != "mJ":
        notes.append(f"energy is in {s.predictor.energy_unit} (the profile's energy model is not calibrated)")
    if s.device_profile.doc["device"].get("origin") == "estimated":
        notes.append(f"profile {s.device_profile.name} is estimated from datasheets, not measured")
    for answer in answers:
        if answer.point is None:
            notes.append(f"nothing on the front meets {describe(answer.budgets, s.costs.energy_unit)}"
                         + (f"; closest: {answer.closest['arch_id']} ("
                            + ", ".join(f"{m} +{100 * e:.1f}%" for m, e in answer.closest["excess"].items()) + ")"
                            if answer.closest else ""))
    if s.expansion is not None:
        notes.append("quantised variants' latency and energy are the fp32 predictions scaled by the speed ratio "
                     "measured on the build host, not on the profiled device")
    return notes


def _profile_record(s: _Searched, profile: Path, out: Path) -> tuple[dict[str, Any], list[Any]]:
    """How the front names its profile, and the parents it records: a profile directory is an
    artifact (recorded relative to this one); a file, by name and sha256."""
    from hmt.artifacts.paths import relative_to_artifact

    record: dict[str, Any] = {**s.predictor.describe(),
                              "path": relative_to_artifact(profile, out) if profile.is_dir() else profile.name}
    parents: list[Any] = [s.loaded.artifact]
    if profile.is_dir():
        from hmt.artifacts import load_artifact
        from hmt.profile.schema import ARTIFACT_KIND

        profile_artifact = load_artifact(profile, kind=ARTIFACT_KIND)
        parents.append(profile_artifact)
        record["manifest_sha256"] = profile_artifact.manifest_sha256
    else:
        record["sha256"] = _sha256(profile)
    return record, parents


def _front_doc(s: _Searched, supernet: Path, out: Path, sorted_points: list[dict[str, Any]],
               answers: list[BudgetAnswer], profile_record: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    from hmt.artifacts.paths import relative_to_artifact
    from hmt.pareto.artifact import FRONT_SCHEMA, FRONT_SCHEMA_VERSION

    loaded, result, options, calibration = s.loaded, s.result, s.options, s.calibration
    front_doc = {
        "schema": FRONT_SCHEMA, "schema_version": FRONT_SCHEMA_VERSION,
        "supernet": {"path": relative_to_artifact(supernet, out), "manifest_sha256": loaded.artifact.manifest_sha256,
                     "space_tag": loaded.space.tag, "backbone": loaded.space.backbone},
        # What a bundle needs of the data, carried here so deploy does not depend on finding the supernet.
        "dataset": {k: loaded.dataset_info.get(k) for k in ("name", "modality", "input_shape", "num_classes",
                                                            "class_names", "mean", "std", "source_sha256")},
        "profile": profile_record, "data": s.data.describe(),
        "bn_statistics": ("re-estimated per variant on the supernet's calibration set "
                          f"({sum(len(b) for b in calibration)} samples)" if calibration is not None
                          else "the supernet's shared statistics"),
        "objectives": list(options.search.objectives),
        "units": {"accuracy": "fraction", "latency_ms": "ms", "energy": s.costs.energy_unit,
                  "memory_mb": "MB (1e6 B)", "params": "count", "macs": "MAC", "activation_peak_bytes": "byte"},
        "budgets": options.budgets.to_json_dict(),
        "answers": [a.to_json_dict() for a in answers],
        "points": sorted_points,
        "search": {"method": options.search.method, "evaluations": result.evaluations,
                   "generations": result.generations, "priced": result.priced, "infeasible": result.infeasible,
                   "stop_reason": result.stop_reason, "wall_s": result.wall_s,
                   "evaluation": result.eval_stats.to_json_dict()},
        "notes": notes,
    }
    if s.expansion is not None:
        front_doc["precision"] = {**s.expansion.to_json_dict(), "options": options.to_json_dict()["precision"],
                                  "latency": "fp32 prediction for the profile x the quantised/fp32 ratio of "
                                             "medians measured on the build host (ONNX Runtime)"}
    return front_doc


def _archive_rows(result: SearchResult, front_records: list[Record]) -> list[dict[str, Any]]:
    front_ids = {r.candidate.key for r in front_records}
    return [{"order": r.order, "generation": r.generation, "arch_id": r.candidate.variant_id,
             "engine": r.candidate.engine, "precision": r.candidate.precision,
             "exit_stage": r.candidate.arch.exit_stage,
             "accuracy": r.accuracy.accuracy, **r.costs.to_json_dict(),
             "derived_from": r.derived_from or "", "on_front": r.candidate.key in front_ids}
            for r in result.records]


def _find_front(supernet: Path, profile: Path, out: Path, options: ParetoOptions,
                progress: ProgressCallback, force: bool) -> ParetoRun:
    from hmt.artifacts.paths import relative_to_artifact
    from hmt.pareto.artifact import write_pareto_artifact
    from hmt.pareto.plot import front_png

    start = time.perf_counter()
    s = _search(supernet, profile, options, progress)
    options, result, unit = s.options, s.result, s.costs.energy_unit
    front_records = [result.records[i] for i in result.front]
    points, index = _front_points(s, front_records)
    answers = _answers(s, points, index)
    metrics = _metrics(s, points, front_records, answers)
    notes = _notes(s, answers)
    profile_record, parents = _profile_record(s, profile, out)
    sorted_points = sorted(points, key=lambda p: (p["latency_ms"], -p["accuracy"]))
    front_doc = _front_doc(s, supernet, out, sorted_points, answers, profile_record, notes)
    limits = options.budgets.limits()
    plot = front_png(
        evaluated=[r.metrics() for r in result.records], front=points,
        latency_budgets_ms=options.budgets.latency_ms, picks=[a.point for a in answers if a.point is not None],
        other_budgets=", ".join(describe({m: v}, unit) for m, v in limits.items() if m != "latency_ms"),
        title=f"{s.loaded.space.tag} on {s.device_profile.name} ({options.search.method}, "
              f"{result.evaluations} evaluations)",
    )
    config = options.to_json_dict(out) | {"supernet": relative_to_artifact(supernet, out),
                                          "profile": profile_record["path"]}
    metrics["total_wall_s"] = time.perf_counter() - start
    write_pareto_artifact(out, front_doc=front_doc, index=index, archive_rows=_archive_rows(result, front_records),
                          plot_png=plot, config=config, parents=parents, metrics=metrics, force=force,
                          inputs=[p for p in (profile, options.data_path) if p])
    return ParetoRun(out, sorted_points, answers, result, metrics, unit, notes)
