"""``serve.json``: the serve config a bundle carries (deploy writes it, serve reads it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hmt.errors import UsageError
from hmt.serve.config import dataclass_from_mapping
from hmt.serve.estimates import EstimatorSettings
from hmt.serve.load_index import LoadWeights
from hmt.serve.optimizer import Budgets, OptimizerConfig
from hmt.serve.switcher import SwitchPolicy

ENGINE_CHOICES = ("auto", "onnxruntime", "tvm")


@dataclass(frozen=True)
class EarlyExit:
    """Stop after a segment when its exit's softmax confidence reaches ``confidence``."""

    enabled: bool = True
    confidence: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence <= 1.0:
            raise UsageError(f"early_exit.confidence must be in (0, 1], got {self.confidence}")


@dataclass(frozen=True)
class BudgetSettings:
    """Budgets in the units users think in; ``None`` = unconstrained."""

    latency_ms: float | None = None
    memory_mb: float | None = None
    energy: float | None = None

    def __post_init__(self) -> None:
        for name in ("latency_ms", "memory_mb", "energy"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise UsageError(f"budgets.{name} must be a number > 0 or null, got {value!r}")

    def to_budgets(self) -> Budgets:
        """The optimizer's budgets: every budget reaches the decision (energy included)."""
        memory = None if self.memory_mb is None else int(self.memory_mb * 1e6)
        return Budgets(latency_ms=self.latency_ms, memory_bytes=memory, energy_mj=self.energy)


@dataclass(frozen=True)
class CorrectionSettings:
    """``r = measured / predicted`` (AdaptiveNet 5.3), smoothed, kept per variant and per engine.

    ``r`` is never clipped: ``[r_min, r_max]`` is the bound beyond which the prediction and
    the measurements are said to disagree (status ``prediction_disagrees``, metric
    ``hmt_prediction_disagreement``); the measurements win either way.
    """

    smoothing: float = 0.3
    r_min: float = 0.2
    r_max: float = 5.0
    # Share of the latency budget the corrected *mean* prediction may use: requests scatter
    # around the mean (and queue near capacity), so a prediction right at the budget misses
    # about half the time.
    headroom: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 < self.headroom <= 1.0:
            raise UsageError(f"correction.headroom must be in (0, 1], got {self.headroom}")
        if not 0.0 < self.smoothing <= 1.0:
            raise UsageError(f"correction.smoothing must be in (0, 1], got {self.smoothing}")
        if not 0.0 < self.r_min <= 1.0 <= self.r_max:
            raise UsageError(f"correction needs 0 < r_min <= 1 <= r_max, got {self.r_min}, {self.r_max}")


@dataclass(frozen=True)
class ServeSettings:
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    switch: SwitchPolicy = field(default_factory=SwitchPolicy)
    load_weights: LoadWeights = field(default_factory=LoadWeights)
    early_exit: EarlyExit = field(default_factory=EarlyExit)
    correction: CorrectionSettings = field(default_factory=CorrectionSettings)
    estimates: EstimatorSettings = field(default_factory=EstimatorSettings)
    preload_memory_mb: float | None = None
    monitor_period_s: float = 1.0
    # A request over budget asks for a decision now, at most once per this interval.
    on_demand_min_interval_s: float = 0.05
    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_CHOICES:
            raise UsageError(f"engine must be one of {list(ENGINE_CHOICES)}, got {self.engine!r}")
        if not (math.isfinite(self.monitor_period_s) and self.monitor_period_s > 0):
            raise UsageError(f"monitor_period_s must be > 0, got {self.monitor_period_s}")
        if not (math.isfinite(self.on_demand_min_interval_s) and self.on_demand_min_interval_s >= 0):
            raise UsageError(f"on_demand_min_interval_s must be >= 0, got {self.on_demand_min_interval_s}")
        if self.preload_memory_mb is not None and not self.preload_memory_mb >= 0:
            raise UsageError(f"preload_memory_mb must be >= 0 or null, got {self.preload_memory_mb}")

    @classmethod
    def from_mapping(cls, data: Any, where: str = "serve.json") -> ServeSettings:
        if not isinstance(data, Mapping):
            raise UsageError(f"{where}: expected a JSON object")
        nested = {
            "budgets": BudgetSettings,
            "optimizer": OptimizerConfig,
            "switch": SwitchPolicy,
            "load_weights": LoadWeights,
            "early_exit": EarlyExit,
            "correction": CorrectionSettings,
            "estimates": EstimatorSettings,
        }
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in nested:
                if not isinstance(value, Mapping):
                    raise UsageError(f"{where}: {key} must be an object")
                kwargs[key] = dataclass_from_mapping(nested[key], value, f"{where}: {key}")
            else:
                kwargs[key] = value
        return dataclass_from_mapping(cls, kwargs, where)

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)
