"""On-device serve stage: resource monitor, load index, variant optimizer and switcher.

Everything here runs on the device, so it imports only the standard library, numpy and
psutil (NVML through ``pynvml`` when it is importable); never torch.
"""

from __future__ import annotations

from hmt.serve.load_index import ARModel, LoadForecaster, LoadWeights, fit_ar, load_index, load_index_of
from hmt.serve.monitor import PsutilSampler, ResourceMonitor, ResourceSample
from hmt.serve.optimizer import (
    Budgets,
    Decision,
    LatencyCorrector,
    Optimizer,
    OptimizerConfig,
    Variant,
    mu_from_battery,
)
from hmt.serve.switcher import Switcher, SwitchPolicy, SwitchResult

__all__ = [
    "ARModel",
    "Budgets",
    "Decision",
    "LatencyCorrector",
    "LoadForecaster",
    "LoadWeights",
    "Optimizer",
    "OptimizerConfig",
    "PsutilSampler",
    "ResourceMonitor",
    "ResourceSample",
    "SwitchPolicy",
    "SwitchResult",
    "Switcher",
    "Variant",
    "fit_ar",
    "load_index",
    "load_index_of",
    "mu_from_battery",
]
