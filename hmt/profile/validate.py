"""Validation: random variants measured end to end against the profile's prediction.

For each of N variants drawn with the caller's generator: the block-table prediction,
and the materialised variant exported to ONNX and timed on the same engine. Reported:
Kendall tau, MAPE and the share within +-10%; then, optionally, the same under a real
background load (processes burning cores) against the load-aware prediction, within
+-20%. A scatter plot (predicted vs measured, both runs) is drawn to PNG bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hmt.profile.fits import kendall_tau, load_index, mape, share_within
from hmt.profile.load import background_load
from hmt.profile.predictor import Predictor
from hmt.profile.timing import Runner
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    import pandas as pd

VALIDATION_UNITS = {"arch_id": "id", "condition": "name", "predicted_ms": "ms", "measured_ms": "ms",
                    "p10_ms": "ms", "p90_ms": "ms", "background_util": "fraction", "load_index": "fraction",
                    "freq_mhz": "MHz"}


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


def validate_variants(
    net: Any, space: Any, predictor: Predictor, runner: Runner, *, n: int, rng: np.random.Generator,
    batch: int = 1, warmup: int = 5, repeats: int = 20, load_processes: int = 0,
    progress: ProgressCallback = no_progress,
) -> ValidationResult:
    """``net`` has ``variant_blocks(arch)`` and ``materialize(arch)``; ``space`` has ``sample(rng)``."""
    import pandas as pd

    variants: list[tuple[Any, Any, tuple[int, ...], float]] = []
    seen: set[str] = set()
    attempts = 0
    while len(variants) < n and attempts < 20 * n:
        attempts += 1
        arch = space.sample(rng)
        if arch.arch_id in seen:
            continue
        seen.add(arch.arch_id)
        model = net.materialize(arch)
        shape = tuple(model.input_shape)
        variants.append((arch, model, shape, predictor.block_sum_ms(net.variant_blocks(arch), batch=batch)))
    rows = []
    conditions = [("idle", 0)] + ([("loaded", load_processes)] if load_processes else [])
    done, total = 0, len(variants) * len(conditions)
    for condition, processes in conditions:
        with background_load(processes):
            for arch, model, shape, predicted in variants:
                m = runner.time(model, (batch, *shape), warmup=warmup, repeats=repeats)
                index = load_index(m.conditions.background_util)
                rows.append({
                    "arch_id": arch.arch_id, "condition": condition,
                    "predicted_ms": predictor.under_load(predicted, index) if processes else predicted,
                    "measured_ms": m.median_ms, "p10_ms": m.p10_ms, "p90_ms": m.p90_ms,
                    "background_util": m.conditions.background_util, "load_index": index,
                    "freq_mhz": m.conditions.freq_mhz or float("nan"),
                })
                done += 1
                progress("validation", done, total, f"{condition} {arch.arch_id}")
    table = pd.DataFrame(rows)
    idle = table[table.condition == "idle"]
    idle_metrics = ValidationMetrics.of(idle.measured_ms.tolist(), idle.predicted_ms.tolist())
    loaded_metrics = None
    if load_processes:
        loaded = table[table.condition == "loaded"]
        loaded_metrics = ValidationMetrics.of(loaded.measured_ms.tolist(), loaded.predicted_ms.tolist())
    return ValidationResult(table, idle_metrics, loaded_metrics, load_processes, scatter_png(table))


def scatter_png(table: pd.DataFrame, *, title: str = "predicted vs measured latency") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    try:
        for condition, marker in (("idle", "o"), ("loaded", "^")):
            part = table[table.condition == condition]
            if len(part):
                ax.scatter(part.measured_ms, part.predicted_ms, marker=marker, label=condition, alpha=0.8)
        lo = float(min(table.measured_ms.min(), table.predicted_ms.min())) * 0.9
        hi = float(max(table.measured_ms.max(), table.predicted_ms.max())) * 1.1
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
