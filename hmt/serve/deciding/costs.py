"""A variant's profiled costs, and the two readings eq. 3 weighs them with: ``mu`` from the
battery and ``r = measured / predicted`` latency (see :mod:`hmt.serve.deciding.optimizer`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hmt.errors import InputError, UsageError
from hmt.runtime.settings import OptimizerConfig


@dataclass(frozen=True)
class Variant:
    """One candidate as profiled: accuracy (any scale, higher is better) and unloaded costs."""

    arch_id: str
    accuracy: float
    latency_ms: float
    energy_mj: float
    memory_bytes: int

    @classmethod
    def from_mapping(cls, record: Mapping[str, Any], where: str = "variant") -> Variant:
        try:
            return cls(
                arch_id=str(record["arch_id"]),
                accuracy=float(record["accuracy"]),
                latency_ms=float(record["latency_ms"]),
                energy_mj=float(record["energy_mj"]),
                memory_bytes=int(record["memory_bytes"]),
            )
        except KeyError as exc:
            raise InputError(f"{where}: missing field {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: {exc}") from exc


def mu_from_battery(
    battery_percent: float | None, battery_plugged: bool | None = None, config: OptimizerConfig | None = None
) -> float:
    """The accuracy weight ``mu`` of eq. 3 from the battery (see the module docstring)."""
    cfg = config if config is not None else OptimizerConfig()
    if battery_percent is None or not math.isfinite(battery_percent):
        mu = cfg.mu_no_battery
    elif battery_plugged and cfg.mu_when_plugged is not None:
        mu = cfg.mu_when_plugged
    else:
        mu = min(cfg.mu_max, max(cfg.mu_min, battery_percent / 100.0))
    if cfg.mu_step > 0:
        mu = round(mu / cfg.mu_step) * cfg.mu_step
    return min(1.0, max(0.0, mu))


class LatencyCorrector:
    """Smoothed ``r = measured / predicted`` latency of the running variant (AdaptiveNet 5.3).

    ``update`` takes the measured latency and the prediction it is compared with (the
    load-scaled prediction, without ``r``) and moves ``r`` toward their ratio by
    ``smoothing`` (exponential moving average); ``r`` is clipped to ``[r_min, r_max]`` so
    that one outlier (a page fault, a cold cache) cannot swing the choice far.
    """

    def __init__(self, smoothing: float = 0.3, r_min: float = 0.2, r_max: float = 5.0) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise UsageError(f"latency ratio smoothing must be in (0, 1], got {smoothing}")
        if not 0.0 < r_min <= 1.0 <= r_max:
            raise UsageError(f"latency ratio bounds need 0 < r_min <= 1 <= r_max, got {r_min}, {r_max}")
        self.smoothing = smoothing
        self.r_min = r_min
        self.r_max = r_max
        self.ratio = 1.0
        self.count = 0

    def update(self, measured_ms: float, predicted_ms: float) -> float:
        if not (math.isfinite(measured_ms) and measured_ms >= 0):
            raise UsageError(f"measured latency must be finite and >= 0 ms, got {measured_ms}")
        if not (math.isfinite(predicted_ms) and predicted_ms > 0):
            raise UsageError(f"predicted latency must be finite and > 0 ms, got {predicted_ms}")
        sample = min(self.r_max, max(self.r_min, measured_ms / predicted_ms))
        self.ratio = sample if self.count == 0 else self.ratio + self.smoothing * (sample - self.ratio)
        self.count += 1
        return self.ratio

    def reset(self) -> None:
        self.ratio = 1.0
        self.count = 0
