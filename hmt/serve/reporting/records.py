"""What the adaptation loop records: one :class:`TickRecord` per decision, one :class:`Prediction`
per request, and the running :class:`Stats` that status and metrics read."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

HISTORY = 2048


@dataclass(frozen=True)
class TickRecord:
    """One decision of the loop, as the timeline and ``/v1/status`` show it."""

    time_s: float  # since the controller started
    trigger: str
    cpu_util: float
    mem_util: float
    gpu_util: float | None
    battery_percent: float | None
    temperature_c: float | None
    load_index: float  # outside load: serve's own CPU time is not counted
    load_forecast: float
    latency_ratio: float  # measured / predicted of the active variant (1 before any measurement)
    overhead_ms: float
    mu: float
    latency_budget_ms: float | None
    memory_budget_mb: float | None
    proposed: str
    active: str
    switched: bool
    switch_reason: str
    feasible: bool
    predicted_latency_ms: float  # the active variant's tail-latency estimate the decision used
    decision_us: float  # wall time of estimates + optimizer + switcher (includes waiting for the GIL)
    decision_cpu_us: float  # this thread's CPU time for the same work: the decision's own cost
    error: str | None = None
    own_cpu_util: float | None = None  # serve's own share of the CPU, left out of the load index
    estimate_source: str = "prior"  # of the active variant: measured or prior
    measured_variants: int = 0  # variants judged on their measurements in this decision
    energy_budget: float | None = None
    estimate_us: float = 0.0  # summarising the latency windows before the decision (not in decision_us)

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prediction:
    class_index: int
    confidence: float
    exit: int
    variant: str
    compute_ms: float
    latency_ms: float  # queue wait + compute
    deadline_miss: bool
    probabilities: Any = None  # float32 softmax over the classes at the answering exit (None: not kept)


@dataclass
class Stats:
    requests: int = 0
    deadline_misses: int = 0
    per_exit: Counter[int] = field(default_factory=Counter)
    per_variant: Counter[str] = field(default_factory=Counter)
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    decision_us: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    latency_sum_ms: float = 0.0
    load_failures: int = 0
    shadow_runs: int = 0
    shadow_s: float = 0.0
    infeasible_ticks: int = 0

    def add_request(self, latency_ms: float, miss: bool, exit_index: int, arch_id: str) -> None:
        """Count one answered request (the caller holds the controller's state lock)."""
        self.requests += 1
        self.deadline_misses += miss
        self.per_exit[exit_index] += 1
        self.per_variant[arch_id] += 1
        self.latency_ms.append(latency_ms)
        self.latency_sum_ms += latency_ms
