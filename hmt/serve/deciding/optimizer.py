"""Choose the variant to run: CrowdHMTware eq. 3 under load-scaled, measurement-corrected costs.

``argmax_v mu*Norm(A_v) - (1-mu)*Norm(E_v)  s.t.  T_v <= T_budget,  M_v <= M_budget``

- ``T_v = T0_v * (1 + alpha_latency * I) * r`` and ``E_v = E0_v * (1 + alpha_energy * I) * r``:
  the profiled cost ``T0``/``E0`` scaled by the load index ``I`` (AdaScale eq. 2) and by
  ``r = measured / predicted`` of the running variant (AdaptiveNet 5.3), smoothed by
  :class:`~hmt.serve.deciding.costs.LatencyCorrector`. Energy takes ``r`` too: energy per inference is power times
  time, so a variant that runs slower than predicted also costs more than predicted.
- ``Norm`` is min-max over the whole table (``norm="log"``: of the logarithm, the
  paper's example). Both scale factors are the same for every variant, so they move the
  latency feasibility line but never the normalised scores; the scores of the table
  are therefore computed once, at construction, and a decision only has to find the
  best score among the feasible variants.
- ``mu = clip(battery_percent / 100, mu_min, mu_max)`` (CrowdHMTware: ``mu = Norm(B_r)``);
  ``mu_no_battery`` on mains-only devices and ``mu_when_plugged`` while charging
  (``None``: use the level anyway). ``mu`` is rounded to ``mu_step``.
- Nothing feasible: the fastest variant that fits the memory budget, flagged
  ``feasible=False``; if none fits memory, the one of least memory (a variant that does
  not fit memory may fail to load at all, which is worse than running late). With the
  estimates' sample times (:meth:`Optimizer.fallback`), the profile's fastest unless a bigger
  variant's lower estimate is at least as new.

Decision cost: the variants are kept sorted by profiled latency, so the latency budget
is a prefix found by bisection; the memory budget is reduced to a count by bisection
on the sorted memory values. The answer for a (prefix, memory count, mu) triple is
computed once with numpy and then cached, so the steady state (budgets and battery
changing slowly) is a few dictionary and bisection operations.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from hmt.compat import strict_zip
from hmt.errors import InputError, UsageError
from hmt.runtime.settings import Budgets, OptimizerConfig
from hmt.serve.deciding.costs import Variant, mu_from_battery

REASON_BEST = "best_within_budgets"
REASON_FASTEST = "infeasible_fastest_in_memory"
REASON_SMALLEST = "infeasible_least_memory"
REASON_MEASURED_FASTEST = "infeasible_fastest_measured"
_CACHE_MAX_ENTRIES = 4096
DEFAULT_ALPHA = 1.0  # T = T0 * (1 + alpha * I) when neither serve.json nor the profile gives alpha


@dataclass(frozen=True)
class Decision:
    """What the optimizer chose and why. Latency and energy are the predictions under the load."""

    arch_id: str
    feasible: bool
    reason_code: str
    score: float
    predicted_latency_ms: float
    predicted_energy_mj: float
    memory_bytes: int
    mu: float
    load_index: float
    latency_scale: float
    budgets: Budgets
    current_arch_id: str | None = None
    current_score: float | None = None
    current_feasible: bool | None = None
    # The whole latency budget per request where ``budgets.latency_ms`` holds its compute share (what
    # is left after the serving overhead, queue wait and the like); None: they are the same.
    request_budget_ms: float | None = None

    @property
    def latency_budget_text(self) -> str:
        """The latency budget as the reason states it: the request's, and its compute share where less."""
        compute_ms = self.budgets.latency_ms
        if self.request_budget_ms is None or compute_ms is None or compute_ms == self.request_budget_ms:
            return f"budget {compute_ms} ms"
        return (f"budget {self.request_budget_ms:g} ms per request, {compute_ms:.3f} ms of it for compute "
                f"after the serving overhead")

    @property
    def reason(self) -> str:
        if self.reason_code == REASON_MEASURED_FASTEST:
            return (f"no variant meets the budgets on the latencies measured now: serving the fastest, "
                    f"{self.arch_id} at p95 {self.predicted_latency_ms:.3f} ms ({self.latency_budget_text}; "
                    f"the profile's fastest unless a variant measured as recently is faster)")
        if self.reason_code == REASON_BEST:
            head = "best mu*Norm(A) - (1-mu)*Norm(E) within budgets"
        elif self.reason_code == REASON_FASTEST:
            head = "no variant meets the budgets: fastest that fits the memory budget"
        else:
            head = "no variant fits the memory budget: least memory"
        return (
            f"{head}; score {self.score:.4f}, mu {self.mu:.2f}, load {self.load_index:.2f}, "
            f"latency x{self.latency_scale:.3f} -> {self.predicted_latency_ms:.3f} ms "
            f"({self.latency_budget_text}), memory {self.memory_bytes / 1e6:g} MB "
            f"(budget {self.budgets.memory_mb} MB)"
        )


class Choice(NamedTuple):
    """The loop's hot-path answer (what the switcher needs); :meth:`Optimizer.decision_of` turns it
    into the full :class:`Decision` record afterwards, outside the timed decision."""

    arch_id: str
    position: int  # in the optimizer's table
    reason_code: str
    score: float
    current_arch_id: str | None
    current_score: float | None
    current_feasible: bool | None


def _normalise(values: np.ndarray, log: bool) -> np.ndarray:
    v = np.log(np.maximum(values, 1e-12)) if log else values
    span = float(v.max() - v.min())
    return np.zeros_like(v) if span <= 0 else (v - v.min()) / span


class Optimizer:
    """Eq. 3 over a fixed table of variants. Build once per table; ``decide`` per tick."""

    def __init__(self, variants: Sequence[Variant | Mapping[str, Any]], config: OptimizerConfig | None = None) -> None:
        config = config if config is not None else OptimizerConfig()
        # Unresolved alphas (no profile to take them from) get the default load model.
        self.config = replace(config, alpha_latency=DEFAULT_ALPHA if config.alpha_latency is None
                              else config.alpha_latency,
                              alpha_energy=DEFAULT_ALPHA if config.alpha_energy is None else config.alpha_energy)
        self.alpha_latency: float = self.config.alpha_latency or 0.0
        self.alpha_energy: float = self.config.alpha_energy or 0.0
        table = [
            v if isinstance(v, Variant) else Variant.from_mapping(v, f"variant {i}") for i, v in enumerate(variants)
        ]
        if not table:
            raise InputError("the optimizer needs at least one variant")
        seen: set[str] = set()
        for v in table:
            if v.arch_id in seen:
                raise InputError(f"duplicate variant arch_id {v.arch_id!r}")
            seen.add(v.arch_id)
            if not (math.isfinite(v.accuracy) and math.isfinite(v.latency_ms) and v.latency_ms > 0):
                raise InputError(f"variant {v.arch_id!r}: accuracy must be finite and latency_ms > 0")
            if not (math.isfinite(v.energy_mj) and v.energy_mj >= 0 and v.memory_bytes >= 0):
                raise InputError(f"variant {v.arch_id!r}: energy_mj and memory_bytes must be >= 0")
        # Latency order (ties: less memory, then higher accuracy, then id), so budgets are prefixes.
        table.sort(key=lambda v: (v.latency_ms, v.memory_bytes, -v.accuracy, v.arch_id))
        self.variants: tuple[Variant, ...] = tuple(table)
        log = self.config.norm == "log"
        accuracy = np.array([v.accuracy for v in table], dtype=np.float64)
        energy = np.array([v.energy_mj for v in table], dtype=np.float64)
        self._acc_term = self.config.accuracy_weight * _normalise(accuracy, log)
        self._energy_term = self.config.energy_weight * _normalise(energy, log)
        self._acc_list = self._acc_term.tolist()
        self._energy_list = self._energy_term.tolist()
        self._latency_list = [v.latency_ms for v in table]
        self._memory = np.array([v.memory_bytes for v in table], dtype=np.int64)
        self._memory_sorted = sorted(v.memory_bytes for v in table)
        self._least_memory = int(np.argmin(self._memory))  # first in latency order among ties
        self._position = {v.arch_id: i for i, v in enumerate(table)}
        self._cache: dict[tuple[int, int, float], tuple[int, str]] = {}
        self._scores: dict[float, list[float]] = {}
        self._orders: dict[float, list[int]] = {}
        self._memory_list = [v.memory_bytes for v in table]
        self._ids = [v.arch_id for v in table]
        self._fits: dict[float | None, tuple[bool, ...]] = {}

    def position(self, arch_id: str) -> int:
        """``arch_id``'s place in the table (latency order)."""
        try:
            return self._position[arch_id]
        except KeyError as exc:
            raise UsageError(f"unknown variant {arch_id!r}; this bundle's variants: "
                             f"{', '.join(v.arch_id for v in self.variants)}") from exc

    def __len__(self) -> int:
        return len(self.variants)

    def variant(self, arch_id: str) -> Variant:
        try:
            return self.variants[self._position[arch_id]]
        except KeyError as exc:
            raise UsageError(f"unknown variant {arch_id!r}; this bundle's variants: "
                             f"{', '.join(v.arch_id for v in self.variants)}") from exc

    def latency_scale(self, load_index: float, latency_ratio: float = 1.0) -> float:
        return (1.0 + self.alpha_latency * load_index) * latency_ratio

    def predicted_latency_ms(self, arch_id: str, load_index: float, latency_ratio: float = 1.0) -> float:
        """The load-scaled (and ``r``-corrected) latency prediction of one variant."""
        return self.variant(arch_id).latency_ms * self.latency_scale(load_index, latency_ratio)

    def _choose(self, k: int, memory_count: int, memory_budget: float | None, mu: float) -> tuple[int, str]:
        key = (k, memory_count, mu)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if k > 0:
            score = mu * self._acc_term[:k] - (1.0 - mu) * self._energy_term[:k]
            if memory_budget is not None and memory_count < len(self.variants):
                score = np.where(self._memory[:k] <= memory_budget, score, -np.inf)
            best = int(np.argmax(score))
            if score[best] > -np.inf:
                result = (best, REASON_BEST)
                return self._remember(key, result)
        if memory_budget is None or memory_count == len(self.variants):
            result = (0, REASON_FASTEST)
        else:
            fits = np.flatnonzero(self._memory <= memory_budget)
            result = (int(fits[0]), REASON_FASTEST) if fits.size else (self._least_memory, REASON_SMALLEST)
        return self._remember(key, result)

    def _remember(self, key: tuple[int, int, float], result: tuple[int, str]) -> tuple[int, str]:
        if len(self._cache) >= _CACHE_MAX_ENTRIES:
            self._cache.clear()
        self._cache[key] = result
        return result

    def scores(self, mu: float) -> list[float]:
        """Eq. 3's score of every variant (latency order) for ``mu``; cached per ``mu``."""
        cached = self._scores.get(mu)
        if cached is None:
            if len(self._scores) >= _CACHE_MAX_ENTRIES:
                self._scores.clear()
            cached = self._scores[mu] = [mu * a - (1.0 - mu) * e
                                         for a, e in strict_zip(self._acc_list, self._energy_list)]
        return cached

    def _order(self, mu: float) -> list[int]:
        """Variant indices by eq. 3's score for ``mu``, best first (ties: the faster by profile)."""
        cached = self._orders.get(mu)
        if cached is None:
            scores = self.scores(mu)
            if len(self._orders) >= _CACHE_MAX_ENTRIES:
                self._orders.clear()
            cached = self._orders[mu] = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return cached

    def memory_fits(self, memory_limit_bytes: float | None) -> tuple[bool, ...]:
        """Per variant (latency order): within ``memory_limit_bytes``; cached per limit."""
        cached = self._fits.get(memory_limit_bytes)
        if cached is None:
            if len(self._fits) >= _CACHE_MAX_ENTRIES:
                self._fits.clear()
            cached = self._fits[memory_limit_bytes] = tuple(
                memory_limit_bytes is None or m <= memory_limit_bytes for m in self._memory_list)
        return cached

    def choose(
        self,
        latency_ms: Sequence[float],
        energy_mj: Sequence[float] | None,
        mu: float,
        budgets: Budgets,
        current_arch_id: str | None = None,
    ) -> Choice:
        """The decision's hot path within ``budgets`` (see :meth:`choose_within`). Same answer as
        :meth:`decide_estimates`."""
        current = -1
        if current_arch_id is not None:
            current = self._position.get(current_arch_id, -2)
            if current == -2:
                raise UsageError(f"unknown current variant {current_arch_id!r}")
        return self.choose_within(latency_ms, energy_mj, mu,
                                  math.inf if budgets.latency_ms is None else budgets.latency_ms,
                                  budgets.memory_bytes, budgets.energy if energy_mj is not None else None, current)

    def choose_within(self, latency_ms: Sequence[float], energy_mj: Sequence[float] | None, mu: float,
                      latency_limit_ms: float, memory_limit_bytes: float | None, energy_limit: float | None,
                      current: int) -> Choice:
        """The best-scoring variant within every limit, checked in score order (usually the first
        or second one is the answer), and whether the active variant (its position ``current``,
        -1: none) is within them. Everything per variant that does not depend on the estimates is
        precomputed and cached per ``mu`` and per memory limit: no per-call allocation but the
        returned :class:`Choice`."""
        mask, fallback = self.feasible_mask(latency_ms, energy_mj, latency_limit_ms, memory_limit_bytes, energy_limit)
        return self.choose_mask(mask, fallback, mu, current)

    def feasible_mask(self, latency_ms: Sequence[float], energy_mj: Sequence[float] | None, latency_limit_ms: float,
                      memory_limit_bytes: float | None, energy_limit: float | None) -> tuple[int, int]:
        """Everything of the estimates a choice depends on, so that :meth:`choose_mask` can be
        cached on it: (bit i set: variant i within every limit; the fallback when none is: the
        fastest by ``latency_ms`` within memory as its position, or ``-1 - position`` of the
        least memory when nothing fits memory; :meth:`fallback` refines it by when each estimate
        was measured)."""
        fits = self._fits.get(memory_limit_bytes)
        if fits is None:
            fits = self.memory_fits(memory_limit_bytes)
        mask = 0
        fastest = -1
        fastest_ms = math.inf
        for i, lat in enumerate(latency_ms):
            if not fits[i]:
                continue
            if lat < fastest_ms:
                fastest, fastest_ms = i, lat
            if lat <= latency_limit_ms and (energy_limit is None or energy_mj[i] <= energy_limit):  # type: ignore[index]
                mask |= 1 << i
        return mask, (-1 - self._least_memory if fastest < 0 else fastest)

    def fallback(self, latency_ms: Sequence[float], newest_s: Sequence[float],
                 memory_limit_bytes: float | None) -> int:
        """The variant to serve when none is feasible (as :meth:`feasible_mask`'s fallback): the
        profile's fastest within memory, unless a slower one by the profile has a lower estimate
        measured at least as recently (``newest_s``: each variant's newest sample, -inf: never).

        When nothing fits, every estimate is over the budget, and a bigger variant that *looks*
        faster than a smaller one does so on evidence from another time: a p95 from before the
        load filled the machine, a few samples, or a calmer load level scaled by the load model,
        against the smaller variant's requests now. Inside a paced device class that made the loop
        climb to the largest variant on a budget violation and fall back at once (issue 28).
        Evidence at least as new as the smaller variant's may still overrule the profile."""
        fits = self.memory_fits(memory_limit_bytes)
        best = -1
        for i, lat in enumerate(latency_ms):  # the table is in the profile's latency order
            if fits[i] and (best < 0 or (lat < latency_ms[best] and newest_s[i] >= newest_s[best])):
                best = i
        return -1 - self._least_memory if best < 0 else best

    def choose_mask(self, mask: int, fallback: int, mu: float, current: int) -> Choice:
        """:meth:`choose_within` given :meth:`feasible_mask`'s answer: the best score among the
        set bits (none: the fallback), and the active variant's (position ``current``, -1: none)
        score and feasibility."""
        order = self._orders.get(mu)
        if order is None:
            order = self._order(mu)
        scores = self._scores.get(mu)
        if scores is None:
            scores = self.scores(mu)
        best = -1
        for i in order:
            if mask >> i & 1:
                best = i
                break
        if best >= 0:
            reason = REASON_BEST
        elif fallback >= 0:
            best, reason = fallback, REASON_MEASURED_FASTEST
        else:
            best, reason = -1 - fallback, REASON_SMALLEST
        if current < 0:
            return Choice(self._ids[best], best, reason, scores[best], None, None, None)
        return Choice(self._ids[best], best, reason, scores[best], self._ids[current], scores[current],
                      bool(mask >> current & 1))

    def decision_of(self, choice: Choice, latency_ms: Sequence[float], energy_mj: Sequence[float], *, mu: float,
                    budgets: Budgets, load_index: float, latency_scale: float) -> Decision:
        """The full record of a :class:`Choice` (for ticks, status and the switcher's callers)."""
        i = choice.position
        return Decision(
            arch_id=choice.arch_id, feasible=choice.reason_code == REASON_BEST, reason_code=choice.reason_code,
            score=choice.score, predicted_latency_ms=latency_ms[i], predicted_energy_mj=energy_mj[i],
            memory_bytes=self._memory_list[i], mu=mu, load_index=load_index, latency_scale=latency_scale,
            budgets=budgets, current_arch_id=choice.current_arch_id, current_score=choice.current_score,
            current_feasible=choice.current_feasible,
        )

    def decide_estimates(
        self,
        latency_ms: Sequence[float],
        energy_mj: Sequence[float] | None = None,
        *,
        mu: float = 1.0,
        budgets: Budgets | None = None,
        current_arch_id: str | None = None,
        load_index: float = 0.0,
        latency_scale: float = 1.0,
    ) -> Decision:
        """Eq. 3 over per-variant estimates (``self.variants`` order): the tail latency each
        variant would serve at now (measured where measured, the prior elsewhere) and its energy.

        Feasible: latency, memory and energy within their budgets. None feasible: the variant
        with the least estimated latency among those within the memory budget (the least
        memory if none is), flagged infeasible with a reason that says so.
        """
        b = budgets if budgets is not None else Budgets()
        scores = self.scores(mu)
        lat_budget = b.latency_ms
        mem_budget = b.memory_bytes
        energy_budget = b.energy
        memory = self._memory_list
        best = -1
        best_score = -math.inf
        feasible_flags = []
        for i, lat in enumerate(latency_ms):
            ok = ((lat_budget is None or lat <= lat_budget) and (mem_budget is None or memory[i] <= mem_budget)
                  and (energy_budget is None or energy_mj is None or energy_mj[i] <= energy_budget))
            feasible_flags.append(ok)
            if ok and scores[i] > best_score:
                best, best_score = i, scores[i]
        if best >= 0:
            reason = REASON_BEST
        else:
            fits = [i for i in range(len(memory)) if mem_budget is None or memory[i] <= mem_budget]
            if fits:
                best = min(fits, key=lambda i: latency_ms[i])
                reason = REASON_MEASURED_FASTEST
            else:
                best, reason = self._least_memory, REASON_SMALLEST
        current_score: float | None = None
        current_feasible: bool | None = None
        if current_arch_id is not None:
            pos = self._position.get(current_arch_id)
            if pos is None:
                raise UsageError(f"unknown current variant {current_arch_id!r}")
            current_score = scores[pos]
            current_feasible = feasible_flags[pos]
        return Decision(
            arch_id=self.variants[best].arch_id, feasible=reason == REASON_BEST, reason_code=reason,
            score=scores[best], predicted_latency_ms=latency_ms[best],
            predicted_energy_mj=self.variants[best].energy_mj if energy_mj is None else energy_mj[best],
            memory_bytes=memory[best], mu=mu, load_index=load_index, latency_scale=latency_scale, budgets=b,
            current_arch_id=current_arch_id, current_score=current_score, current_feasible=current_feasible,
        )

    def decide(
        self,
        load_index: float = 0.0,
        battery_percent: float | None = None,
        battery_plugged: bool | None = None,
        budgets: Budgets | None = None,
        latency_ratio: float = 1.0,
        current_arch_id: str | None = None,
    ) -> Decision:
        """The best variant now; also scores ``current_arch_id`` (for the switcher) when given."""
        if not (0.0 <= load_index <= 1.0):
            raise UsageError(f"load index must be in 0..1, got {load_index}")
        if not (math.isfinite(latency_ratio) and latency_ratio > 0):
            raise UsageError(f"latency ratio must be finite and > 0, got {latency_ratio}")
        cfg = self.config
        b = budgets if budgets is not None else Budgets()
        mu = mu_from_battery(battery_percent, battery_plugged, cfg)
        latency_scale = (1.0 + self.alpha_latency * load_index) * latency_ratio
        if b.energy is not None:
            # The prefix search covers latency and memory; an energy budget takes the general path.
            energy_scale = (1.0 + self.alpha_energy * load_index) * latency_ratio
            return self.decide_estimates([t * latency_scale for t in self._latency_list],
                                         [v.energy_mj * energy_scale for v in self.variants], mu=mu, budgets=b,
                                         current_arch_id=current_arch_id, load_index=load_index,
                                         latency_scale=latency_scale)
        n = len(self._latency_list)
        k = n if b.latency_ms is None else bisect_right(self._latency_list, b.latency_ms / latency_scale)
        memory_count = n if b.memory_bytes is None else bisect_right(self._memory_sorted, b.memory_bytes)
        index, reason_code = self._choose(k, memory_count, b.memory_bytes, mu)
        chosen = self.variants[index]
        energy_scale = (1.0 + self.alpha_energy * load_index) * latency_ratio
        current_score: float | None = None
        current_feasible: bool | None = None
        if current_arch_id is not None:
            pos = self._position.get(current_arch_id)
            if pos is None:
                raise UsageError(f"unknown current variant {current_arch_id!r}")
            current_score = mu * self._acc_list[pos] - (1.0 - mu) * self._energy_list[pos]
            current = self.variants[pos]
            current_feasible = pos < k and (b.memory_bytes is None or current.memory_bytes <= b.memory_bytes)
        return Decision(
            arch_id=chosen.arch_id,
            feasible=reason_code == REASON_BEST,
            reason_code=reason_code,
            score=mu * self._acc_list[index] - (1.0 - mu) * self._energy_list[index],
            predicted_latency_ms=chosen.latency_ms * latency_scale,
            predicted_energy_mj=chosen.energy_mj * energy_scale,
            memory_bytes=chosen.memory_bytes,
            mu=mu,
            load_index=load_index,
            latency_scale=latency_scale,
            budgets=b,
            current_arch_id=current_arch_id,
            current_score=current_score,
            current_feasible=current_feasible,
        )
