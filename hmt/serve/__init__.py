"""On-device serve stage, by what each part does.

Everything here runs on the device, so it imports only the standard library, numpy and
psutil (NVML through ``pynvml`` when it is importable); never torch. The parts are imported
by module, so that ``import hmt.serve`` stays light:

- ``deciding``: resource monitor, load index, measured latency estimates, the optimizer
  (eq. 3), the bundle's variant table and the cached decision path;
- ``running``: the variants' runners and pool, the hysteresis switcher, serve --adapt,
  scenario replay, opt-in dynamic ``batching``, ``overrides`` (settings layered over
  serve.json) and ``session`` (what ``hmt serve`` runs);
- ``reporting``: tick and request records, ``metrics`` (Prometheus, through
  prometheus_client), OpenAPI, a replay's timeline;
- ``http``: the starlette app (/v1 and the Open Inference Protocol /v2 in ``oip`` +
  ``oip_tensors``), ``answers`` + ``bodies`` (probabilities, top-k, multipart), body
  decoding, connection guards, ``logs``, uvicorn;
- ``controller``: the adaptation loop that wires them for one bundle.
"""

from __future__ import annotations

from hmt.serve.deciding.costs import LatencyCorrector, Variant, mu_from_battery
from hmt.serve.deciding.load_index import ARModel, LoadForecaster, LoadWeights, fit_ar, load_index, load_index_of
from hmt.serve.deciding.monitor import PsutilSampler, ResourceMonitor, ResourceSample
from hmt.serve.deciding.optimizer import Budgets, Decision, Optimizer, OptimizerConfig
from hmt.serve.running.switcher import Switcher, SwitchPolicy, SwitchResult

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
