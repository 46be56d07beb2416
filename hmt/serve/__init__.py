"""On-device serve stage: resource monitor, load index, variant optimizer and switcher.

Everything here runs on the device, so it imports only the standard library, numpy and
psutil (NVML through ``pynvml`` when it is importable); never torch. The rest of the
stage is imported by module, so that ``import hmt.serve`` stays light: ``runner`` (a
variant's chain of graphs on ONNX Runtime or TVM, early exit), ``pool`` (loaded variants
within a memory budget), ``controller`` (the adaptation loop), ``api`` + ``exposition``
(the starlette app, OpenAPI), ``oip`` + ``oip_tensors`` (the Open Inference Protocol, /v2),
``answers`` + ``bodies`` (probabilities, top-k, multipart), ``metrics`` (Prometheus, through
prometheus_client), ``batching`` (opt-in dynamic batching), ``overrides`` (settings layered
over serve.json), ``logs``, ``server`` (uvicorn, token, drain),
``scenario`` + ``timeline`` (replay, load generation, summary, plot) and ``session``
(what ``hmt serve`` runs).
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
