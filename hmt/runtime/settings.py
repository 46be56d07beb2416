"""``serve.json``: the serve config a bundle carries. deploy writes and verifies it, serve reads it.

It sits in the runtime floor (torch-free, no serve import) so that deploy and serve share one
schema without deploy importing serve. Budgets have one type, :class:`Budgets`, in the units
users give them (``deploy --latency-ms/--memory-mb/--energy-mj``, serve.json ``budgets``): ms, MB and
mJ per inference (refused where the variants' energies are relative, from an uncalibrated profile);
serve.json, the optimizer and the loop all take it as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from hmt.errors import UsageError

T = TypeVar("T")

# The smallest latency budget taken anywhere (settings, --latency-ms, a scenario's column): one
# microsecond; below it, latency / budget ratios overflow and summaries would hold infinities.
MIN_LATENCY_BUDGET_MS = 1e-3
# The control loop's period: a tick costs ~1 ms of CPU, so a period near zero spins a core while
# idle (1e-9 s kept one at 95 %); above an hour the loop no longer follows the device.
MIN_MONITOR_PERIOD_S = 0.01
MAX_MONITOR_PERIOD_S = 3600.0
# Samples kept per variant and load level (estimates.window): bounded, as every size serve keeps.
MAX_ESTIMATES_WINDOW = 65536


# A field's annotation (a string: this module uses postponed annotations) -> what a JSON value of it
# may be. Fields of other types (the nested sections) are built by their own from_mapping first.
_JSON_KINDS = {"bool": "true or false", "int": "an integer", "float": "a finite number", "str": "a string",
               "None": "null"}


def _fits_kind(value: Any, kind: str) -> bool:
    if kind == "None":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # true is not 1 here: a switch in a number's place is a mistake
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, str)


def _check_types(cls: type[Any], mapping: Mapping[str, Any], where: str) -> None:
    """Every value of ``mapping`` of the JSON type its field of ``cls`` is annotated with.

    Before ``cls(**mapping)``: the range checks in ``__post_init__`` compare, and a string or a
    list there would raise Python's own TypeError, naming no key (or pass: NaN compares false).
    """
    for f in fields(cls):
        if f.name not in mapping or not isinstance(f.type, str):
            continue
        kinds = [part.strip() for part in f.type.split("|")]
        if not all(kind in _JSON_KINDS for kind in kinds):
            continue
        value = mapping[f.name]
        if not any(_fits_kind(value, kind) for kind in kinds):
            expected = " or ".join(_JSON_KINDS[kind] for kind in kinds)
            shown = repr(value) if isinstance(value, (bool, int, float, str)) or value is None else type(value).__name__
            raise UsageError(f"{where}: {f.name} must be {expected}, got {shown[:40]}")


def dataclass_from_mapping(cls: type[T], mapping: Mapping[str, Any], where: str) -> T:
    """``cls(**mapping)``, refusing unknown keys and wrong arguments with a UsageError naming ``where``."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(mapping) - names)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(names)}")
    _check_types(cls, mapping, where)  # a switch given as "yes" or 1 would be truthy, silently
    try:
        return cls(**dict(mapping))
    except TypeError as exc:
        raise UsageError(f"{where}: {exc}") from exc


@dataclass(frozen=True)
class Budgets:
    """Run-time budgets, in the units users give them; ``None`` = unconstrained.

    serve.json's ``budgets`` object, ``deploy --latency-ms/--memory-mb/--energy-mj`` and the
    optimizer's constraints are this one type (no conversion in between that could drop one).
    """

    latency_ms: float | None = None  # whole server-side request: queue + parse + compute
    memory_mb: float | None = None  # loaded variants (10**6 bytes)
    energy: float | None = None  # mJ per inference (a calibrated profile's unit; refused on relative energies)

    def __post_init__(self) -> None:
        for name in ("latency_ms", "memory_mb", "energy"):
            value = getattr(self, name)
            if value is None:
                continue
            # A memory budget of 0 is legal (nothing fits: the loop serves the least memory). A latency
            # budget below a microsecond is refused: ratios against it overflow to infinity.
            lowest = {"memory_mb": 0.0, "latency_ms": MIN_LATENCY_BUDGET_MS}.get(name)
            low_ok = value > 0 if lowest is None else value >= lowest
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and low_ok):
                bound = "> 0" if lowest is None else f">= {lowest:g}"
                raise UsageError(f"budgets.{name} must be a number {bound} or null, got {value!r}")

    @property
    def memory_bytes(self) -> float | None:
        """The memory budget in bytes, as variants' ``memory_bytes`` are compared against it."""
        return None if self.memory_mb is None else self.memory_mb * 1e6


@dataclass(frozen=True)
class OptimizerConfig:
    # None: the load model profile-device fitted (the bundle profile's models.load.alpha),
    # or DEFAULT_ALPHA without one; a number set in serve.json wins over the profile.
    alpha_latency: float | None = None
    alpha_energy: float | None = None
    accuracy_weight: float = 1.0
    energy_weight: float = 1.0
    mu_min: float = 0.2
    mu_max: float = 1.0
    mu_no_battery: float = 1.0
    mu_when_plugged: float | None = 1.0
    mu_step: float = 0.01
    norm: str = "minmax"

    def __post_init__(self) -> None:
        for name in ("alpha_latency", "alpha_energy", "accuracy_weight", "energy_weight", "mu_step"):
            value = getattr(self, name)
            if value is None and name.startswith("alpha_"):
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise UsageError(f"optimizer {name} must be a finite number >= 0, got {value}")
        if not 0.0 <= self.mu_min <= self.mu_max <= 1.0:
            raise UsageError(f"optimizer needs 0 <= mu_min <= mu_max <= 1, got {self.mu_min}, {self.mu_max}")
        for name in ("mu_no_battery", "mu_when_plugged"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise UsageError(f"optimizer {name} must be in 0..1, got {value}")
        if self.norm not in ("minmax", "log"):
            raise UsageError(f"optimizer norm must be 'minmax' or 'log', got {self.norm!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> OptimizerConfig:
        return dataclass_from_mapping(cls, mapping, "serve optimizer config")


@dataclass(frozen=True)
class SwitchPolicy:
    score_margin: float = 0.05
    violation_patience: int = 2
    improve_patience: int = 2
    # Slow release: the active variant must have served this long before an improvement (not a
    # violation) replaces it. 1 s: after a load step lifts, the loop climbs back within about a
    # second (with improve_patience ticks of monitor_period_s).
    min_dwell_s: float = 1.0
    # This many requests in a row over the latency budget confirm a violation at once (no
    # patience): the fast attack after a load step. 0 turns it off.
    miss_streak: int = 3
    # > 0: a variant climbed to that violated within two dwell times waits twice the dwell before
    # the next climb to it, up to this many seconds (against probing up every dwell under load).
    probe_backoff_max_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.probe_backoff_max_s) and self.probe_backoff_max_s >= 0):
            raise UsageError(f"switch probe_backoff_max_s must be >= 0, got {self.probe_backoff_max_s}")
        if self.miss_streak < 0:
            raise UsageError(f"switch miss_streak must be >= 0, got {self.miss_streak}")
        if not self.score_margin >= 0:
            raise UsageError(f"switch score_margin must be >= 0, got {self.score_margin}")
        if self.violation_patience < 1 or self.improve_patience < 1:
            raise UsageError("switch violation_patience and improve_patience must be >= 1")
        if not self.min_dwell_s >= 0:
            raise UsageError(f"switch min_dwell_s must be >= 0, got {self.min_dwell_s}")

    @classmethod
    def from_mapping(cls, mapping: dict[str, Any]) -> SwitchPolicy:
        return dataclass_from_mapping(cls, mapping, "serve switch policy")


@dataclass(frozen=True)
class LoadWeights:
    """Weights of eq. 2. Non-negative; those of the resources present must not all be zero.

    The defaults count the CPU only, the same index profile-device fits its load model's
    alpha with (``hmt.profile.fits.load_index``): serve scales latencies by that alpha, so
    it must read the load the same way. Memory pressure is the memory budget's business.
    """

    cpu: float = 1.0
    gpu: float = 0.0
    memory: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cpu", "gpu", "memory"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise UsageError(f"load weight {name!r} must be a finite number >= 0, got {value!r}")
        if self.cpu + self.gpu + self.memory <= 0:
            raise UsageError("load weights must not all be zero")


MODE_MEASURED = "measured"
MODE_PREDICTED = "predicted"


@dataclass(frozen=True)
class EstimatorSettings:
    """serve.json ``estimates``: how measurements replace the profile's predictions.

    ``mode="predicted"`` ignores measurements (the profile times the load model only): an
    ablation baseline, and a way to pin decisions to the budgets in tests.
    """

    window: int = 64  # samples kept per variant and load level
    min_samples: int = 5  # samples at a load level before its p95 is trusted over the prior
    # Within a load level, samples more than this older than the level's newest are stale (the
    # machine moved on at that level). 1.5 s holds ~100 requests at the rates serve sees under load.
    max_age_s: float = 1.5
    # Load levels: the outside load index [0, 1] in this many buckets centred on 0, 1/(n-1), ..., 1
    # (5: idle, a quarter, one of two cores, ...). A variant not run recently is judged on what it
    # measured at a similar load, not on a prior from another load (1: one level, as before).
    load_buckets: int = 5
    # A level's measurements are forgotten this long after they were taken (then the prior, or the
    # nearest level's, again): bounds how long one bad sample keeps a variant out at that level.
    memory_s: float = 30.0
    quantile: float = 0.95
    default_tail: float = 1.3  # p95 / median assumed before any window has enough samples
    shadow_share: float = 0.05  # at most this share of wall time goes to shadow runs of idle variants
    # ... and only while the device is idle: outside load index below this. A shadow run on busy
    # cores takes CPU from the requests (ORT workers spin after each run).
    shadow_max_load: float = 0.5
    # One request in 1 / probe_share is served by a variant faster (by the profile) than the active
    # one that has no measurement within memory_s, nearest first: shadow runs starve while the
    # active variant keeps the workers busy, and the prior of a variant never run (the profile's
    # prediction x the engine's r, learnt on the active one) can be 2x off, enough to skip the
    # variant that fits under load for a smaller one. Faster, so the request cannot miss more.
    probe_share: float = 0.05
    # 0: a variant's last 3 samples floor its estimate (their lower median: 2 of 3 slow). > 0: the
    # samples of its last floor_span_s instead (at least 2): at 100 requests/s 3 samples span 30 ms,
    # no evidence of a load step on a sub-ms engine (an ablation that did not change the default:
    # benchmarks/serve/results/floor_span.json).
    floor_span_s: float = 0.0
    mode: str = MODE_MEASURED

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_samples < 1 or self.min_samples > self.window:
            raise UsageError(f"estimates needs 1 <= min_samples <= window, got {self.min_samples}, {self.window}")
        if self.window > MAX_ESTIMATES_WINDOW:
            raise UsageError(f"estimates.window must be at most {MAX_ESTIMATES_WINDOW}, got {self.window}")
        if not (math.isfinite(self.max_age_s) and self.max_age_s > 0):
            raise UsageError(f"estimates.max_age_s must be > 0, got {self.max_age_s}")
        if not 1 <= self.load_buckets <= 20:
            raise UsageError(f"estimates.load_buckets must be in [1, 20], got {self.load_buckets}")
        if not (math.isfinite(self.memory_s) and self.memory_s >= self.max_age_s):
            raise UsageError(f"estimates.memory_s must be >= max_age_s ({self.max_age_s}), got {self.memory_s}")
        if not 0.5 <= self.quantile < 1.0:
            raise UsageError(f"estimates.quantile must be in [0.5, 1), got {self.quantile}")
        if not (math.isfinite(self.default_tail) and self.default_tail >= 1.0):
            raise UsageError(f"estimates.default_tail must be >= 1, got {self.default_tail}")
        if not 0.0 <= self.shadow_max_load <= 1.0:
            raise UsageError(f"estimates.shadow_max_load must be in [0, 1], got {self.shadow_max_load}")
        if not 0.0 <= self.shadow_share <= 0.5:
            raise UsageError(f"estimates.shadow_share must be in [0, 0.5], got {self.shadow_share}")
        if not 0.0 <= self.floor_span_s <= self.max_age_s:
            raise UsageError(f"estimates.floor_span_s must be in [0, max_age_s], got {self.floor_span_s}")
        if not 0.0 <= self.probe_share <= 0.5:
            raise UsageError(f"estimates.probe_share must be in [0, 0.5], got {self.probe_share}")
        if self.mode not in (MODE_MEASURED, MODE_PREDICTED):
            raise UsageError(f"estimates.mode must be {MODE_MEASURED!r} or {MODE_PREDICTED!r}, got {self.mode!r}")


ENGINE_CHOICES = ("auto", "onnxruntime", "tvm")
OVERHEAD_MODES = ("tail", "median")  # CorrectionSettings.overhead


@dataclass(frozen=True)
class EarlyExit:
    """Stop after a segment when its exit's softmax confidence reaches ``confidence``."""

    enabled: bool = True
    confidence: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence <= 1.0:
            raise UsageError(f"early_exit.confidence must be in (0, 1], got {self.confidence}")


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
    # Share of the compute budget (the latency budget less the serving overhead measured now) the
    # estimates may use. 1.0: the estimates are p95s already (measured, or priors times the tail
    # factor), so a further margin counts the tail twice. Measured against 0.8 in the same runs: the
    # same misses and 0.4-14 points more top-1 under load on TVM (benchmarks/serve/results/headroom.json).
    headroom: float = 1.0
    # How the serving overhead (the budget's share no variant can use) is read from the requests
    # the active variant served: "tail" (default), p95 of queue wait + compute less p95 of compute,
    # so the active variant's compute p95 fits the limit exactly when its served latency p95 fits
    # the budget (the miss criterion); "median", the median queue wait (what serve read before:
    # a compute p95 plus a median wait under-states the latency p95 the budget is judged on).
    overhead: str = "tail"
    # The overhead per load level (the estimates' levels), so a busy phase's queue waits do not
    # hold the compute limit down after the load lifts; False: one window for every load (before).
    overhead_by_load: bool = True
    # True: the active variant stays within the overhead's lower bound, another is moved to within
    # its upper bound (ServingOverhead.limits_ms: no switching on a window's sampling noise). Off by
    # default: on a fake clock it stopped an oscillation under bursty waits, but in the ORT matrix it
    # tracked the oracle in 12 of 18 phases against 15 with the point overhead, climbing back later
    # (benchmarks/serve/results/matrix_overhead_bounds.json against matrix_level.json).
    overhead_bounds: bool = False
    # True (default): the active variant stays while its compute fits the limit the overhead's
    # lower bound leaves (one order statistic under the p95), another is moved to within the point
    # overhead: a few queue-wait spikes (a stalled interpreter) in a short window do not send the
    # loop off the largest at idle, and climbing back is as prompt as with the point alone. In the
    # ORT matrix at 5 ms (quiet VM, 3 repetitions): the second bundle tracked the oracle in 13 of
    # 18 phases against 8 with the point overhead, the demo bundle in 15 of 18 either way, with
    # fewer switches in steady phases (benchmarks/serve/results/matrix_stay*.json).
    overhead_stay_bound: bool = True

    def __post_init__(self) -> None:
        if self.overhead not in OVERHEAD_MODES:
            raise UsageError(f"correction.overhead must be one of {', '.join(OVERHEAD_MODES)}, got {self.overhead!r}")
        if not 0.0 < self.headroom <= 1.0:
            raise UsageError(f"correction.headroom must be in (0, 1], got {self.headroom}")
        if not 0.0 < self.smoothing <= 1.0:
            raise UsageError(f"correction.smoothing must be in (0, 1], got {self.smoothing}")
        if not 0.0 < self.r_min <= 1.0 <= self.r_max:
            raise UsageError(f"correction needs 0 < r_min <= 1 <= r_max, got {self.r_min}, {self.r_max}")


@dataclass(frozen=True)
class ServeSettings:
    budgets: Budgets = field(default_factory=Budgets)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    switch: SwitchPolicy = field(default_factory=SwitchPolicy)
    load_weights: LoadWeights = field(default_factory=LoadWeights)
    early_exit: EarlyExit = field(default_factory=EarlyExit)
    correction: CorrectionSettings = field(default_factory=CorrectionSettings)
    estimates: EstimatorSettings = field(default_factory=EstimatorSettings)
    preload_memory_mb: float | None = None
    # Keep this much of the device's available memory free (MB; None: off): the loaded variants grow
    # only into what is available above it (hmt.serve.deciding.free_memory).
    memory_reserve_mb: float | None = None
    # Cores' worth of CPU time per second this device gives serve's cgroup where no kernel quota says
    # so (a CPU paced from outside, a hypervisor's cap; None: the kernel's quota, if any): the load
    # index then reads the cgroup's CPU time over it (hmt.serve.deciding.monitor).
    cpu_quota_cores: float | None = None
    # Periodic decisions (misses ask for one at once anyway): 4 a second, so improvement patience
    # (2 ticks) and the load forecast follow a step within half a second. A tick costs ~1 ms of CPU.
    monitor_period_s: float = 0.25
    # A request over budget asks for a decision now, at most once per this interval.
    on_demand_min_interval_s: float = 0.05
    engine: str = "auto"

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_CHOICES:
            raise UsageError(f"engine must be one of {list(ENGINE_CHOICES)}, got {self.engine!r}")
        if not MIN_MONITOR_PERIOD_S <= self.monitor_period_s <= MAX_MONITOR_PERIOD_S:
            raise UsageError(f"monitor_period_s must be in [{MIN_MONITOR_PERIOD_S}, {MAX_MONITOR_PERIOD_S}] s, "
                             f"got {self.monitor_period_s}")
        if not (math.isfinite(self.on_demand_min_interval_s) and self.on_demand_min_interval_s >= 0):
            raise UsageError(f"on_demand_min_interval_s must be >= 0, got {self.on_demand_min_interval_s}")
        if self.preload_memory_mb is not None and not self.preload_memory_mb >= 0:
            raise UsageError(f"preload_memory_mb must be >= 0 or null, got {self.preload_memory_mb}")
        reserve = self.memory_reserve_mb
        if reserve is not None and (isinstance(reserve, bool) or not isinstance(reserve, (int, float))
                                    or not (math.isfinite(reserve) and reserve >= 0)):
            raise UsageError(f"memory_reserve_mb must be a number >= 0 or null, got {reserve!r}")
        quota = self.cpu_quota_cores
        if quota is not None and (isinstance(quota, bool) or not isinstance(quota, (int, float))
                                  or not (math.isfinite(quota) and quota > 0)):
            raise UsageError(f"cpu_quota_cores must be a number of cores > 0 or null, got {quota!r}")

    @classmethod
    def from_mapping(cls, data: Any, where: str = "serve.json") -> ServeSettings:
        if not isinstance(data, Mapping):
            raise UsageError(f"{where}: expected a JSON object")
        nested = {
            "budgets": Budgets,
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
