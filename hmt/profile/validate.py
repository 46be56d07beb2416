"""Validation: random variants measured end to end against the profile's prediction.

For each of N variants drawn with the caller's generator: the block-table prediction,
and the materialised variant exported to ONNX and timed on the same engine. Reported:
Kendall tau, MAPE and the share within +-10%; then, optionally, the same under a real
background load (processes burning cores) against the load-aware prediction, within
+-20%. A scatter plot (predicted vs measured, both runs) is drawn to PNG bytes.

The prediction is the predictor's (the block-table sum, composition-corrected when the
profile has a correction); the raw sum is kept beside it (``raw_predicted_ms``) and
scored too. ``calibrate_composition`` measures the variants the correction is fitted on,
with a generator of its own; validation skips any variant it measured (no test-set
leakage).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hmt.errors import UsageError
from hmt.profile.composition import MIN_CALIBRATION_VARIANTS, CompositionFeatures, CompositionModel, fit_composition
from hmt.profile.fits import LinearFit, kendall_tau, load_index, mape, share_within
from hmt.profile.load import background_load
from hmt.profile.predictor import Predictor
from hmt.profile.timing import Runner
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    import pandas as pd

VALIDATION_UNITS = {"arch_id": "id", "condition": "name", "predicted_ms": "ms", "raw_predicted_ms": "ms",
                    "measured_ms": "ms", "p10_ms": "ms", "p90_ms": "ms", "background_util": "fraction",
                    "load_index": "fraction", "freq_mhz": "MHz"}
CALIBRATION_UNITS = {"arch_id": "id", "raw_predicted_ms": "ms", "n_blocks": "count", "n_layers": "count",
                     "measured_ms": "ms", "p10_ms": "ms", "p90_ms": "ms", "background_util": "fraction",
                     "freq_mhz": "MHz", "fitted_ms": "ms"}


@dataclass(frozen=True)
class ValidationMetrics:
    n: int
    kendall_tau: float
    mape: float
    within_10pct: float
    within_20pct: float

    @classmethod
    def of(cls, measured: Sequence[float], predicted: Sequence[float]) -> ValidationMetrics:
        return cls(len(measured), kendall_tau(measured, predicted), mape(measured, predicted),
                   share_within(measured, predicted, 0.10), share_within(measured, predicted, 0.20))

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "kendall_tau": self.kendall_tau, "mape": self.mape,
                "within_10pct": self.within_10pct, "within_20pct": self.within_20pct}


@dataclass(frozen=True)
class ValidationResult:
    table: pd.DataFrame
    idle: ValidationMetrics
    loaded: ValidationMetrics | None
    load_processes: int
    plot_png: bytes
    # The same variants scored against the uncorrected block-table sum; None when the
    # predictor applied no composition correction (then the two are the same).
    idle_raw: ValidationMetrics | None = None
    loaded_raw: ValidationMetrics | None = None


@dataclass(frozen=True)
class CalibrationResult:
    table: pd.DataFrame
    fit: LinearFit
    model: CompositionModel
    arch_ids: frozenset[str]


def sample_variants(space: Any, n: int, rng: np.random.Generator, *,
                    exclude: frozenset[str] = frozenset()) -> list[Any]:
    """Up to ``n`` distinct variants (fewer when the space runs out), none in ``exclude``."""
    archs: list[Any] = []
    seen: set[str] = set(exclude)
    attempts = 0
    while len(archs) < n and attempts < 20 * n:
        attempts += 1
        arch = space.sample(rng)
        if arch.arch_id in seen:
            continue
        seen.add(arch.arch_id)
        archs.append(arch)
    return archs


def calibrate_composition(
    net: Any, space: Any, predictor: Predictor, runner: Runner, *, n: int, rng: np.random.Generator,
    batch: int = 1, warmup: int = 5, repeats: int = 20, seed: int = 0, progress: ProgressCallback = no_progress,
) -> CalibrationResult:
    """Measure ``n`` random variants end to end (idle) and fit the composition correction
    of the raw block-table sum to them (``composition.fit_composition``)."""
    import pandas as pd

    archs = sample_variants(space, n, rng)
    if len(archs) < MIN_CALIBRATION_VARIANTS:
        raise UsageError(f"the composition correction needs >= {MIN_CALIBRATION_VARIANTS} distinct calibration "
                         f"variants; {len(archs)} were drawn (asked {n}): raise --calibrate-variants or use a larger "
                         "space")
    features: list[CompositionFeatures] = []
    rows = []
    for index, arch in enumerate(archs):
        f = predictor.composition_features(net.variant_blocks(arch), batch=batch)
        model = net.materialize(arch)
        m = runner.time(model, (batch, *tuple(model.input_shape)), warmup=warmup, repeats=repeats)
        features.append(f)
        rows.append({"arch_id": arch.arch_id, "raw_predicted_ms": f.raw_ms, "n_blocks": f.n_blocks,
                     "n_layers": f.n_layers, "measured_ms": m.median_ms, "p10_ms": m.p10_ms, "p90_ms": m.p90_ms,
                     "background_util": m.conditions.background_util,
                     "freq_mhz": m.conditions.freq_mhz or float("nan")})
        progress("composition calibration", index + 1, len(archs), arch.arch_id)
    table = pd.DataFrame(rows, columns=list(CALIBRATION_UNITS))
    fit = fit_composition(features, table.measured_ms.tolist(), seed=seed, labels=table.arch_id.tolist())
    model = CompositionModel.from_fit(fit, batch=batch)
    table["fitted_ms"] = [model.apply(f) for f in features]
    return CalibrationResult(table, fit, model, frozenset(str(a) for a in table.arch_id))


def validate_variants(
    net: Any, space: Any, predictor: Predictor, runner: Runner, *, n: int, rng: np.random.Generator,
    batch: int = 1, warmup: int = 5, repeats: int = 20, load_processes: int = 0,
    exclude: frozenset[str] = frozenset(), progress: ProgressCallback = no_progress,
) -> ValidationResult:
    """``net`` has ``variant_blocks(arch)`` and ``materialize(arch)``; ``space`` has ``sample(rng)``.
    Variants whose id is in ``exclude`` (the calibration variants) are never drawn."""
    import pandas as pd

    variants: list[tuple[Any, Any, tuple[int, ...], float, float]] = []
    archs = sample_variants(space, n, rng, exclude=exclude)
    if not archs:
        raise UsageError(f"no validation variants left outside the {len(exclude)} calibration variants: the space is "
                         "that small; lower --calibrate-variants")
    for arch in archs:
        model = net.materialize(arch)
        shape = tuple(model.input_shape)
        pairs = net.variant_blocks(arch)
        variants.append((arch, model, shape, predictor.block_sum_ms(pairs, batch=batch),
                         predictor.raw_block_sum_ms(pairs, batch=batch)))
    rows = []
    conditions = [("idle", 0)] + ([("loaded", load_processes)] if load_processes else [])
    done, total = 0, len(variants) * len(conditions)
    for condition, processes in conditions:
        with background_load(processes):
            for arch, model, shape, predicted, raw in variants:
                m = runner.time(model, (batch, *shape), warmup=warmup, repeats=repeats)
                index = load_index(m.conditions.background_util)
                rows.append({
                    "arch_id": arch.arch_id, "condition": condition,
                    "predicted_ms": predictor.under_load(predicted, index) if processes else predicted,
                    "raw_predicted_ms": predictor.under_load(raw, index) if processes else raw,
                    "measured_ms": m.median_ms, "p10_ms": m.p10_ms, "p90_ms": m.p90_ms,
                    "background_util": m.conditions.background_util, "load_index": index,
                    "freq_mhz": m.conditions.freq_mhz or float("nan"),
                })
                done += 1
                progress("validation", done, total, f"{condition} {arch.arch_id}")
    table = pd.DataFrame(rows, columns=list(VALIDATION_UNITS))
    corrected = predictor.corrects(batch)

    def metrics(condition: str, column: str) -> ValidationMetrics:
        part = table[table.condition == condition]
        return ValidationMetrics.of(part.measured_ms.tolist(), part[column].tolist())

    loaded_on = bool(load_processes)
    return ValidationResult(
        table, metrics("idle", "predicted_ms"), metrics("loaded", "predicted_ms") if loaded_on else None,
        load_processes, scatter_png(table, raw=corrected),
        idle_raw=metrics("idle", "raw_predicted_ms") if corrected else None,
        loaded_raw=metrics("loaded", "raw_predicted_ms") if corrected and loaded_on else None)


def scatter_png(table: pd.DataFrame, *, title: str = "predicted vs measured latency", raw: bool = False) -> bytes:
    """Predicted vs measured per condition; with ``raw`` the uncorrected sums of the idle
    run too (hollow), so the plot shows what the composition correction moved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    try:
        for condition, marker in (("idle", "o"), ("loaded", "^")):
            part = table[table.condition == condition]
            if len(part):
                ax.scatter(part.measured_ms, part.predicted_ms, marker=marker, label=condition, alpha=0.8)
        idle = table[table.condition == "idle"]
        if raw and len(idle):
            ax.scatter(idle.measured_ms, idle.raw_predicted_ms, marker="o", facecolors="none", edgecolors="grey",
                       label="idle, raw block sum")
        columns = ["predicted_ms", "raw_predicted_ms"] if raw else ["predicted_ms"]
        lo = float(min(table.measured_ms.min(), table[columns].min().min())) * 0.9
        hi = float(max(table.measured_ms.max(), table[columns].max().max())) * 1.1
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=1, label="exact")
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="±10%")
        ax.set_xlabel("measured latency (ms)")
        ax.set_ylabel("predicted latency (ms)")
        ax.set_title(title)
        ax.legend()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()
