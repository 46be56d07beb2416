"""The precision gene: quantised copies of front variants compete on the front.

Precision is a gene of the candidate (``Candidate.precision``) but not one NSGA-II
mutates: pricing a quantised variant means exporting, quantising and running it on the
held-out images (seconds, not the microseconds the block-cost model takes), so the gene is
searched exhaustively where it can matter. After the fp32 search, every variant on the
fp32 front (fastest first, at most ``max_candidates``) is built at each extra precision:

- accuracy: the fp32 and the quantised ONNX chains classify the same held-out images the
  search used (ORT, every exit); a quantised variant losing more than ``max_accuracy_drop``
  at its last exit is refused (kept out of the archive, listed in the report). Its record's
  accuracy is the quantised chain's, shifted by the fp32 record's torch/ORT offset (zero up
  to float rounding) so both precisions are measured on one scale;
- latency and energy: the fp32 prediction for the profile times the quantised/fp32 ratio
  of medians measured here, both chains alternating in one loop (ORT CPU provider; fp16
  needs the CUDA provider); the ratio is this host's, recorded so a reader can judge how
  far it carries to the target; a copy no faster than fp32 here is refused (:func:`refusal`);
- memory: weights at the precision's width (1 byte int8, 2 fp16) + the fp32 activation peak.

The front is then recomputed over the fp32 archive and the admitted quantised variants.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hmt.errors import HmtError, UsageError
from hmt.pareto.evaluate import ArchAccuracy
from hmt.pareto.objectives import BYTES_PER_MB, Costs
from hmt.pareto.records import Record, SearchResult
from hmt.pareto.search import front_of
from hmt.precision import BYTES_PER_PARAM, FP16, FP32, PRECISIONS
from hmt.progress import ProgressCallback, no_progress


@dataclass(frozen=True)
class PrecisionOptions:
    precisions: tuple[str, ...] = (FP32,)
    max_accuracy_drop: float = 0.01  # fraction: 0.01 is one point
    max_candidates: int = 8
    calibration_samples: int = 256
    activation: str = "uint8"
    timing_repeats: int = 40

    @property
    def extra(self) -> tuple[str, ...]:
        return tuple(p for p in dict.fromkeys(self.precisions) if p != FP32)

    def validate(self) -> PrecisionOptions:
        unknown = [p for p in self.precisions if p not in PRECISIONS]
        if unknown:
            raise UsageError(f"unknown precision(s) {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            raise UsageError(f"max accuracy drop must be a fraction in [0, 1], got {self.max_accuracy_drop}")
        if self.max_candidates < 1 or self.calibration_samples < 1 or self.timing_repeats < 3:
            raise UsageError("precision candidates and calibration samples must be >= 1, timing repeats >= 3")
        return self


@dataclass
class PrecisionExpansion:
    records: list[Record] = field(default_factory=list)  # admitted quantised variants
    checks: list[dict[str, Any]] = field(default_factory=list)  # every variant tried, admitted or not
    hypervolume_fp32: float | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {"admitted": [r.candidate.variant_id for r in self.records], "checks": self.checks}


def check_device(options: PrecisionOptions, device: str) -> None:
    """FP16 is for GPU providers: refuse it where no CUDA provider can time it."""
    if FP16 in options.extra:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise UsageError("fp16 variants are for GPU providers, and this ONNX Runtime has no CUDA provider to "
                             "measure them (install onnxruntime-gpu on a GPU host); use --precision int8 on CPUs")


def read_chains(converted: Path) -> dict[str, tuple[list[Any], list[Any]]]:
    """Variant id -> (segment graphs, exit graphs), in chain order, of a converted artifact (verified load)."""
    from hmt.convert.graph import load_onnx
    from hmt.convert.pipeline import load_converted

    artifact, report = load_converted(converted)
    chains = {}
    for entry in report["variants"]:
        graphs = sorted(entry["graphs"], key=lambda g: (g["role"], g["index"]))
        chains[str(entry.get("arch_id") or entry["name"])] = (
            [load_onnx(artifact.file(g["file"])) for g in graphs if g["role"] == "segment"],
            [load_onnx(artifact.file(g["file"])) for g in graphs if g["role"] == "exit"])
    return chains


def _fp32_chains(supernet: Path, arch_ids: Sequence[str], tmp: Path) -> dict[str, tuple[list[Any], list[Any]]]:
    from hmt.convert import SupernetSource, convert_model

    convert_model(SupernetSource(supernet, tuple(arch_ids)), tmp / "converted")
    return read_chains(tmp / "converted")


def _quantised_costs(fp32: Costs, precision: str, ratio: float) -> Costs:
    weights = fp32.params * BYTES_PER_PARAM[precision]
    return replace(fp32, latency_ms=fp32.latency_ms * ratio, energy=fp32.energy * ratio,
                   memory_mb=(weights + fp32.activation_peak_bytes) / BYTES_PER_MB)


def refusal(drop: float, latency_ratio: float, within_budgets: bool, options: PrecisionOptions) -> str | None:
    """Why a quantised copy is kept off the front, or None to admit it.

    ``drop``: accuracy lost at the last exit (a fraction); ``latency_ratio``: its median over
    the fp32 twin's, both timed in one loop here. A copy no faster than its fp32 twin is
    refused even where its smaller weights would put it on a memory objective's front: on
    tiny variants quantise/dequantise and layout changes cost more than the integer kernels
    save (0.69x on the shipped supernet's smallest), and a bundle that switches to such a copy
    to save time would lose time.
    """
    if drop > options.max_accuracy_drop:
        return f"accuracy drop {100 * drop:.2f} > {100 * options.max_accuracy_drop:.2f} points"
    if latency_ratio >= 1.0:
        return f"no faster than fp32 here (latency ratio {latency_ratio:.3f})"
    if not within_budgets:
        return "outside the budgets"
    return None


def expand_precisions(supernet: Path, result: SearchResult, data: Any, options: PrecisionOptions, *,
                      device: str = "cpu", progress: ProgressCallback = no_progress) -> PrecisionExpansion:
    """Quantised copies of the fp32 front's variants, measured; ``result`` gains them and a new front."""
    from hmt.precision.accuracy import chain_accuracy
    from hmt.precision.calibration import calibration_array, held_out_arrays
    from hmt.precision.measure import time_chains
    from hmt.precision.quantize import QuantOptions, quantize_chain
    from hmt.supernet import load_supernet

    options = options.validate()
    expansion = PrecisionExpansion()
    if not options.extra:
        return expansion
    check_device(options, device)
    front = sorted((result.records[i] for i in result.front if result.records[i].candidate.precision == FP32),
                   key=lambda r: (r.costs.latency_ms, -r.accuracy.accuracy))[: options.max_candidates]
    if not front:
        return expansion
    x, y = held_out_arrays(data)
    calibration = calibration_array(load_supernet(supernet))
    quant = QuantOptions(activation=options.activation, calibration_samples=options.calibration_samples)
    limits = result.budgets.limits()
    total = len(front) * len(options.extra)
    done = 0
    with tempfile.TemporaryDirectory(prefix="hmt-precision-") as tmp:
        progress("precision", 0, total, "exporting the fp32 front")
        chains = _fp32_chains(supernet, [r.candidate.arch.arch_id for r in front], Path(tmp))
        for record in front:
            arch = record.candidate.arch
            segs, exits = chains[arch.arch_id]
            fp32_acc = chain_accuracy(segs, exits, x, y)
            offset = record.accuracy.accuracy - fp32_acc[-1]  # torch vs ORT on the same images: ~0
            for precision in options.extra:
                progress("precision", done, total, f"{arch.arch_id} {precision}")
                done += 1
                check: dict[str, Any] = {"arch_id": arch.arch_id, "precision": precision,
                                         "fp32_ort_accuracy_per_exit": fp32_acc}
                try:
                    q_chain = quantize_chain(segs, exits, calibration, precision, options=quant)
                    q_acc = chain_accuracy(*q_chain, x, y)
                    timings = time_chains({FP32: (segs, exits), precision: q_chain}, x[:1],
                                          device="cuda" if precision == FP16 else device,
                                          repeats=options.timing_repeats)
                except HmtError as exc:
                    expansion.checks.append(check | {"admitted": False, "error": str(exc)})
                    continue
                ratio = timings[precision].median_ms / timings[FP32].median_ms
                drop = fp32_acc[-1] - q_acc[-1]
                costs = _quantised_costs(record.costs, precision, ratio)
                within = all(costs.metric(m) <= v for m, v in limits.items())
                refused = refusal(drop, ratio, within, options)
                check |= {"accuracy_per_exit": q_acc, "drop_points": round(100 * drop, 3),
                          "latency_ratio_measured_here": round(ratio, 4),
                          "fp32_median_ms_here": round(timings[FP32].median_ms, 4),
                          "median_ms_here": round(timings[precision].median_ms, 4),
                          "admitted": refused is None, "refused_because": refused}
                expansion.checks.append(check)
                if refused is not None:
                    continue
                candidate = replace(record.candidate, precision=precision)
                per_exit = tuple(min(1.0, max(0.0, a + offset)) for a in q_acc)
                accuracy = ArchAccuracy(candidate.variant_id, arch.exit_stage, per_exit)
                expansion.records.append(Record(len(result.records) + len(expansion.records), record.generation,
                                                candidate, costs, accuracy))
    progress("precision", total, total, None)
    result.records.extend(expansion.records)
    result.front = front_of(result.records, result.options.objectives)
    return expansion


__all__ = ["PrecisionExpansion", "PrecisionOptions", "check_device", "expand_precisions", "read_chains", "refusal"]
