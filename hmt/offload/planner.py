"""Choose variant and cut together: CrowdHMTware eq. 3 with a communication term (no torch).

Options: every variant all local, and every variant cut at each of its cuts with the
tensor sent in the codec that costs least now. Predicted end-to-end time of an option,
each part charged to the side that spends it::

    local:    T = T_local(v) * r_device
    cut c:    T = (T_head(v, c) + codec_ms) * r_device + T_exchange
                  + f_remote * (rtt + bytes(c, codec) * ms_per_byte + T_tail(v, c) * r_peer + queue_peer)

with ``r_device`` = measured / warm compute time on the device at a recent high percentile
(the budget is a tail target), ``T_exchange`` the device's own time in one HTTP exchange
with the peer (its CPU and its wait for its core, measured on every exchange, probes
included: :mod:`hmt.offload.timing`), the link (RTT and cost per byte) from
:mod:`hmt.offload.link` fed with round trips *minus* the device's and the peer's own time,
``r_peer`` and ``queue_peer`` from the peer's reports, and ``f_remote`` >= 1 the 90th
percentile of observed / predicted link + peer time over recent offloaded requests.
Feasible: ``T <= T_budget`` (and the peer reachable). Among feasible options eq. 3 picks:
``mu*Norm(A) - (1-mu)*Norm(E)``, where the device's
energy of a cut is the profiled energy times the share of the compute that stays on the
device plus ``radio_mj_per_kb`` per KiB sent. Options of equal score (the same variant
on mains power, ``mu = 1``) are ranked by predicted time, so the cut is the fastest one.
Nothing feasible: the fastest option.

Hysteresis, as the local switcher does it: a better-scoring option needs ``min_dwell_s``
in the current one; an equally scored one must also be predicted ``hysteresis`` faster.
A current option that became infeasible or unreachable is left at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hmt.errors import UsageError
from hmt.offload.codec import CODECS
from hmt.offload.link import LinkEstimate

LOCAL = "local"


@dataclass(frozen=True)
class CutCost:
    index: int
    device_ms: float  # warm, on the device
    peer_ms: float  # warm, on the peer (from its /v1/status)
    bytes_by_codec: dict[str, int]
    codec_ms: dict[str, float] = field(default_factory=dict)  # encode + decode of this tensor


@dataclass(frozen=True)
class VariantCost:
    arch_id: str
    accuracy: float
    energy: float
    local_ms: float  # warm, the whole chain on the device
    cuts: tuple[CutCost, ...]


@dataclass(frozen=True)
class PlannerConfig:
    hysteresis: float = 0.15
    min_dwell_s: float = 1.0
    codecs: tuple[str, ...] = CODECS
    codec_min_gain_ms: float = 0.05  # a lossier codec must save at least this much
    radio_mj_per_kb: float = 0.0
    score_epsilon: float = 1e-6
    # False: never run all-local while the peer is usable (the always-offload baseline, tests).
    local_with_peer: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.hysteresis < 1 or self.min_dwell_s < 0:
            raise UsageError(f"hysteresis must be in [0, 1) and min_dwell_s >= 0, got {self.hysteresis}, "
                             f"{self.min_dwell_s}")
        unknown = [c for c in self.codecs if c not in CODECS]
        if unknown or "float32" not in self.codecs:
            raise UsageError(f"codecs {list(self.codecs)}: expected float32 and any of {list(CODECS)}")


@dataclass(frozen=True)
class Option:
    arch_id: str
    cut: int | None  # None: all local
    codec: str
    predicted_ms: float
    energy: float
    score: float
    feasible: bool
    remote_ms: float = 0.0  # of predicted_ms: link + peer before f_remote (0 for local)

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.arch_id, self.cut)

    @property
    def label(self) -> str:
        return f"{self.arch_id}@{LOCAL if self.cut is None else f'cut{self.cut}/{self.codec}'}"


@dataclass(frozen=True)
class Conditions:
    """What the device knows now. ``link=None``: the peer is not usable (breaker open)."""

    link: LinkEstimate | None
    budget_ms: float
    device_ratio: float = 1.0
    peer_ratio: float = 1.0
    peer_queue_ms: float = 0.0
    mu: float = 1.0
    # The device's own time in one exchange with the peer (CPU + wait for its core), at its tail.
    exchange_ms: float = 0.0
    # Observed / predicted time of the remote part (transfer + peer), at a high percentile of
    # recent offloaded requests: a link and peer that are right on average but often late are
    # planned at their tail, as the latency budget is a tail target.
    remote_factor: float = 1.0


@dataclass(frozen=True)
class Choice:
    option: Option
    best: Option
    switched: bool
    reason: str


def _norm(values: Sequence[float]) -> Callable[[float], float]:
    low, high = min(values), max(values)
    span = high - low
    return (lambda v: 0.0) if span <= 0 else (lambda v: (v - low) / span)


class OffloadPlanner:
    def __init__(self, variants: Sequence[VariantCost], config: PlannerConfig | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        if not variants:
            raise UsageError("the offload planner needs at least one variant")
        self.variants = tuple(variants)
        self.config = config if config is not None else PlannerConfig()
        import time

        self.clock = clock if clock is not None else time.monotonic
        self._acc = _norm([v.accuracy for v in variants])
        self._energy = _norm([v.energy for v in variants])
        self.current: Option | None = None
        self.since_s = 0.0
        self.switches = 0

    def _codec(self, cut: CutCost, link: LinkEstimate, device_ratio: float) -> tuple[str, float]:
        """The codec whose transfer plus encode/decode (on the device's current speed) costs least."""
        def cost(codec: str) -> float:
            return link.transfer_ms(cut.bytes_by_codec[codec]) + cut.codec_ms.get(codec, 0.0) * device_ratio

        best, best_ms = "float32", cost("float32")
        for codec in self.config.codecs:
            if cost(codec) < best_ms - self.config.codec_min_gain_ms:
                best, best_ms = codec, cost(codec)
        return best, best_ms

    def options(self, now: Conditions) -> list[Option]:
        out: list[Option] = []
        for v in self.variants:
            acc = now.mu * self._acc(v.accuracy)
            local_ms = v.local_ms * now.device_ratio
            local_score = acc - (1 - now.mu) * self._energy(v.energy)
            if now.link is None or self.config.local_with_peer or not v.cuts:
                out.append(Option(v.arch_id, None, "-", local_ms, v.energy, local_score, local_ms <= now.budget_ms))
            if now.link is None:
                continue
            for cut in v.cuts:
                codec, _ = self._codec(cut, now.link, now.device_ratio)
                codec_ms = cut.codec_ms.get(codec, 0.0)
                remote = now.link.transfer_ms(cut.bytes_by_codec[codec]) + cut.peer_ms * now.peer_ratio \
                    + now.peer_queue_ms
                device_ms = (cut.device_ms + codec_ms) * now.device_ratio + now.exchange_ms
                t = device_ms + remote * max(1.0, now.remote_factor)
                share = min(1.0, cut.device_ms / v.local_ms) if v.local_ms > 0 else 0.0
                energy = v.energy * share + self.config.radio_mj_per_kb * cut.bytes_by_codec[codec] / 1024
                score = acc - (1 - now.mu) * self._energy(energy)
                out.append(Option(v.arch_id, cut.index, codec, t, energy, score, t <= now.budget_ms, remote))
        return out

    def _best(self, options: list[Option]) -> Option:
        feasible = [o for o in options if o.feasible]
        if not feasible:
            return min(options, key=lambda o: o.predicted_ms)
        eps = self.config.score_epsilon
        top = max(o.score for o in feasible)
        return min((o for o in feasible if o.score >= top - eps), key=lambda o: o.predicted_ms)

    def decide(self, now: Conditions) -> Choice:
        options = self.options(now)
        best = self._best(options)
        t = self.clock()
        current = None if self.current is None else next((o for o in options if o.key == self.current.key), None)
        cfg = self.config
        if current is None:
            reason = "initial" if self.current is None else "current option unavailable (peer not usable)"
        elif best.key == current.key:
            return self._stay(current, best, "best already")
        elif not current.feasible and best.feasible:
            reason = "current option over budget"
        elif not current.feasible and not best.feasible:
            if best.predicted_ms >= current.predicted_ms * (1 - cfg.hysteresis):
                return self._stay(current, best, "nothing feasible; not enough faster")
            reason = "nothing feasible; fastest"
        elif t - self.since_s < cfg.min_dwell_s:
            return self._stay(current, best, "dwell")
        elif best.score > current.score + cfg.score_epsilon:
            reason = "better eq. 3 score"
        elif best.predicted_ms < current.predicted_ms * (1 - cfg.hysteresis):
            reason = f"predicted {best.predicted_ms:.2f} ms vs {current.predicted_ms:.2f} ms"
        else:
            return self._stay(current, best, "within hysteresis")
        if self.current is not None:
            self.switches += 1
        self.current = best
        self.since_s = t
        return Choice(best, best, True, reason)

    def _stay(self, current: Option, best: Option, reason: str) -> Choice:
        self.current = current
        return Choice(current, best, False, reason)
