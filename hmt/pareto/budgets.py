"""BudgetSweep: several budget values per metric in one pareto run (a sweep of budgets, not the
one set of limits a deployed model runs under: that is :class:`hmt.runtime.settings.Budgets`).

The search treats the loosest value of each metric as a hard constraint (nothing above
it is worth an accuracy evaluation) and seeds and mutates near *every* value given
(NearbyInit / NearbyMutate). The report answers each combination of values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hmt.compat import strict_zip
from hmt.errors import UsageError

UNITS = {"latency_ms": "ms", "energy": "", "memory_mb": "MB"}


@dataclass(frozen=True)
class BudgetSweep:
    latency_ms: tuple[float, ...] = ()
    energy: tuple[float, ...] = ()
    memory_mb: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for metric in ("latency_ms", "energy", "memory_mb"):
            values = getattr(self, metric)
            for value in values:
                if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                    raise UsageError(f"{metric} budget {value!r} must be a positive finite number")
            object.__setattr__(self, metric, tuple(sorted({float(v) for v in values})))

    @classmethod
    def of(cls, *, latency_ms: Sequence[float] | None = None, energy: Sequence[float] | None = None,
           memory_mb: Sequence[float] | None = None) -> BudgetSweep:
        return cls(tuple(latency_ms or ()), tuple(energy or ()), tuple(memory_mb or ()))

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m for m in ("latency_ms", "energy", "memory_mb") if getattr(self, m))

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def limits(self) -> dict[str, float]:
        """The loosest budget of each metric given: the search's constraints."""
        return {m: max(getattr(self, m)) for m in self.metrics}

    def targets(self) -> list[tuple[str, float]]:
        """Every (metric, value) given: where NearbyInit and NearbyMutate aim."""
        return [(m, v) for m in self.metrics for v in getattr(self, m)]

    def combos(self) -> list[dict[str, float]]:
        """Every combination of one value per metric given (one empty dict if none)."""
        metrics = self.metrics
        return [dict(strict_zip(metrics, values))
                for values in itertools.product(*(getattr(self, m) for m in metrics))]

    def to_json_dict(self) -> dict[str, list[float]]:
        return {m: list(getattr(self, m)) for m in ("latency_ms", "energy", "memory_mb")}


def describe(combo: dict[str, float], energy_unit: str = "mJ") -> str:
    """``latency <= 5 ms, memory <= 2 MB`` for a report."""
    if not combo:
        return "no budget"
    parts = []
    for metric, value in combo.items():
        unit = energy_unit if metric == "energy" else UNITS[metric]
        parts.append(f"{metric.split('_')[0]} <= {value:g}{(' ' + unit) if unit else ''}")
    return ", ".join(parts)
