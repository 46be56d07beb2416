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

Both time their variants interleaved when given a ``Drift`` (``interleave.py``: groups of
at most 10 variants resident at once, R rounds in a shuffled order per round, a fixed
reference variant between them), so a change of the machine during the run hits every
variant alike and shows as a change of the reference. The tables then carry, beside the
raw ``measured_ms``, ``normalised_ms`` (scaled by the reference around each visit) and
``reference_ms``; validation scores the normalised times as ``idle_normalised``. Without
a ``Drift`` (or with a runner that sets ``interleaves = False``, TVM) each variant is
timed alone in turn, as before.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hmt.errors import UsageError
from hmt.profile.composition import MIN_CALIBRATION_VARIANTS, CompositionModel, fit_composition
from hmt.profile.fits import LinearFit, kendall_tau, load_index, mape, share_within
from hmt.profile.interleave import InterleavedTiming, InterleaveSettings, time_interleaved
from hmt.profile.load import background_load
from hmt.profile.predictor import Predictor
from hmt.profile.timing import Measurement, Runner
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    import pandas as pd

VALIDATION_UNITS = {"arch_id": "id", "condition": "name", "predicted_ms": "ms", "raw_predicted_ms": "ms",
                    "measured_ms": "ms", "p10_ms": "ms", "p90_ms": "ms", "background_util": "fraction",
                    "load_index": "fraction", "freq_mhz": "MHz", "normalised_ms": "ms", "reference_ms": "ms"}
CALIBRATION_UNITS = {"arch_id": "id", "raw_predicted_ms": "ms", "n_blocks": "count", "n_layers": "count",
                     "measured_ms": "ms", "p10_ms": "ms", "p90_ms": "ms", "background_util": "fraction",
                     "freq_mhz": "MHz", "normalised_ms": "ms", "reference_ms": "ms", "fitted_ms": "ms"}


@dataclass
class Drift:
    """How to interleave, and the reference every phase of one run shares.

    ``reference`` is the prepared run of a fixed variant (``reference_id``), resident for
    the whole run; ``rng`` draws the per-round orders (seeded from the run's seed);
    ``level_ms`` is the reference level normalised times are scaled to: None until the
    first idle phase sets it (its median of per-round reference medians), then shared so
    calibration and validation are normalised alike. ``phases`` collects each phase's
    timing for the profile's drift report.
    """

    reference: Callable[[], object]
    reference_id: str
    rng: np.random.Generator
    settings: InterleaveSettings = field(default_factory=InterleaveSettings)
    level_ms: float | None = None
    phases: list[tuple[str, InterleavedTiming]] = field(default_factory=list)
    clock: Callable[[], int] = time.perf_counter_ns  # ns; a fake one in tests


def _measure(net: Any, runner: Runner, archs: Sequence[Any], *, batch: int, warmup: int, repeats: int,
             drift: Drift | None, phase: str, idle: bool, progress: Callable[[int], None],
             ) -> tuple[list[Measurement], list[float], list[float]]:
    """Measurements (raw), normalised and reference times of ``archs``: interleaved with
    ``drift`` (NaN normalised times without); models are materialised only when timed."""
    if drift is None or not getattr(runner, "interleaves", True):
        out = []
        for i, arch in enumerate(archs):
            model = net.materialize(arch)
            out.append(runner.time(model, (batch, *tuple(model.input_shape)), warmup=warmup, repeats=repeats))
            progress(i)
        nan = [float("nan")] * len(out)
        return out, nan, nan

    def prepare(i: int) -> Callable[[], object]:
        model = net.materialize(archs[i])
        return runner.prepare(model, (batch, *tuple(model.input_shape)))

    result = time_interleaved(prepare, len(archs), reference=drift.reference, warmup=warmup, repeats=repeats,
                              rng=drift.rng, settings=drift.settings, level_ms=drift.level_ms if idle else None,
                              clock=drift.clock, progress=progress)
    if idle and drift.level_ms is None:
        drift.level_ms = result.level_ms
    drift.phases.append((phase, result))
    return result.measurements, result.normalised_ms, result.reference_ms


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
    # The idle run scored on reference-normalised times (interleaved timing only).
    idle_normalised: ValidationMetrics | None = None
    idle_raw_normalised: ValidationMetrics | None = None


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
    drift: Drift | None = None, fit_normalised: bool = False,
) -> CalibrationResult:
    """Measure ``n`` random variants end to end (idle; interleaved with ``drift``) and fit
    the composition correction of the raw block-table sum to them
    (``composition.fit_composition``): to the raw medians, or with ``fit_normalised`` to
    the reference-normalised ones."""
    import pandas as pd

    archs = sample_variants(space, n, rng)
    if len(archs) < MIN_CALIBRATION_VARIANTS:
        raise UsageError(f"the composition correction needs >= {MIN_CALIBRATION_VARIANTS} distinct calibration "
                         f"variants; {len(archs)} were drawn (asked {n}): raise --calibrate-variants or use a larger "
                         "space")
    features = [predictor.composition_features(net.variant_blocks(arch), batch=batch) for arch in archs]
    done = [0]

    def tick(i: int) -> None:
        done[0] += 1
        progress("composition calibration", done[0], len(archs), archs[i].arch_id)

    measured, normalised, reference = _measure(net, runner, archs, batch=batch, warmup=warmup, repeats=repeats,
                                               drift=drift, phase="calibration", idle=True, progress=tick)
    rows = []
    for arch, f, m, norm, ref in zip(archs, features, measured, normalised, reference, strict=True):
        rows.append({"arch_id": arch.arch_id, "raw_predicted_ms": f.raw_ms, "n_blocks": f.n_blocks,
                     "n_layers": f.n_layers, "measured_ms": m.median_ms, "p10_ms": m.p10_ms, "p90_ms": m.p90_ms,
                     "background_util": m.conditions.background_util,
                     "freq_mhz": m.conditions.freq_mhz or float("nan"), "normalised_ms": norm, "reference_ms": ref})
    table = pd.DataFrame(rows, columns=list(CALIBRATION_UNITS))
    target = table.normalised_ms if fit_normalised and table.normalised_ms.notna().all() else table.measured_ms
    fit = fit_composition(features, target.tolist(), seed=seed, labels=table.arch_id.tolist())
    model = CompositionModel.from_fit(fit, batch=batch)
    table["fitted_ms"] = [model.apply(f) for f in features]
    return CalibrationResult(table, fit, model, frozenset(str(a) for a in table.arch_id))


def validate_variants(
    net: Any, space: Any, predictor: Predictor, runner: Runner, *, n: int, rng: np.random.Generator,
    batch: int = 1, warmup: int = 5, repeats: int = 20, load_processes: int = 0,
    exclude: frozenset[str] = frozenset(), progress: ProgressCallback = no_progress, drift: Drift | None = None,
) -> ValidationResult:
    """``net`` has ``variant_blocks(arch)`` and ``materialize(arch)``; ``space`` has ``sample(rng)``.
    Variants whose id is in ``exclude`` (the calibration variants) are never drawn. With
    ``drift`` each condition (idle, then loaded) times its variants interleaved; the loaded
    run is normalised to its own reference level (the load is what it measures)."""
    import pandas as pd

    archs = sample_variants(space, n, rng, exclude=exclude)
    if not archs:
        raise UsageError(f"no validation variants left outside the {len(exclude)} calibration variants: the space is "
                         "that small; lower --calibrate-variants")
    predictions = []
    for arch in archs:
        pairs = net.variant_blocks(arch)
        predictions.append((predictor.block_sum_ms(pairs, batch=batch), predictor.raw_block_sum_ms(pairs, batch=batch)))
    rows = []
    conditions = [("idle", 0)] + ([("loaded", load_processes)] if load_processes else [])
    done, total = [0], len(archs) * len(conditions)
    for condition, processes in conditions:
        def tick(i: int, condition: str = condition) -> None:
            done[0] += 1
            progress("validation", done[0], total, f"{condition} {archs[i].arch_id}")

        with background_load(processes):
            measured, normalised, reference = _measure(
                net, runner, archs, batch=batch, warmup=warmup, repeats=repeats, drift=drift,
                phase=f"validation-{condition}", idle=not processes, progress=tick)
        for arch, (predicted, raw), m, norm, ref in zip(archs, predictions, measured, normalised, reference,
                                                         strict=True):
            index = load_index(m.conditions.background_util)
            rows.append({
                "arch_id": arch.arch_id, "condition": condition,
                "predicted_ms": predictor.under_load(predicted, index) if processes else predicted,
                "raw_predicted_ms": predictor.under_load(raw, index) if processes else raw,
                "measured_ms": m.median_ms, "p10_ms": m.p10_ms, "p90_ms": m.p90_ms,
                "background_util": m.conditions.background_util, "load_index": index,
                "freq_mhz": m.conditions.freq_mhz or float("nan"), "normalised_ms": norm, "reference_ms": ref,
            })
    table = pd.DataFrame(rows, columns=list(VALIDATION_UNITS))
    corrected = predictor.corrects(batch)

    def metrics(condition: str, column: str, measured: str = "measured_ms") -> ValidationMetrics:
        part = table[table.condition == condition]
        return ValidationMetrics.of(part[measured].tolist(), part[column].tolist())

    loaded_on = bool(load_processes)
    idle = table[table.condition == "idle"]
    normalised_on = bool(len(idle)) and bool(idle.normalised_ms.notna().all())
    return ValidationResult(
        table, metrics("idle", "predicted_ms"), metrics("loaded", "predicted_ms") if loaded_on else None,
        load_processes, scatter_png(table, raw=corrected),
        idle_raw=metrics("idle", "raw_predicted_ms") if corrected else None,
        loaded_raw=metrics("loaded", "raw_predicted_ms") if corrected and loaded_on else None,
        idle_normalised=metrics("idle", "predicted_ms", "normalised_ms") if normalised_on else None,
        idle_raw_normalised=(metrics("idle", "raw_predicted_ms", "normalised_ms")
                             if normalised_on and corrected else None))


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
