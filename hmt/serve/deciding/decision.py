"""The loop's decision path, reduced to what a choice depends on and cached on it (issue 14: <= 10 us).

A tick has two timed stages (``estimate_us`` and ``decision_us`` in its record):

- :meth:`DecisionPath.feasible`: the estimates (kept up to date on each measurement by
  :class:`~hmt.serve.deciding.estimates.LatencyEstimator`) against the budgets give the *feasible set*
  (a bit mask over the table) and the fallback when it is empty
  (:meth:`~hmt.serve.deciding.optimizer.Optimizer.feasible_mask`); recomputed only when the estimates,
  the load bucket, the compute budget or a budget changed. An empty set's fallback is the profile's
  fastest unless a bigger variant's lower estimate is at least as new
  (:meth:`~hmt.serve.deciding.optimizer.Optimizer.fallback`);
- :meth:`DecisionPath.choose`: eq. 3 over the feasible set. A choice depends only on (feasible
  set, mu, active variant), so it is computed once per such triple and then looked up.

Everything else the tick records (:meth:`DecisionPath.record`: the full
:class:`~hmt.serve.deciding.optimizer.Decision` with its predictions) is built after the timed part.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from hmt.compat import strict_zip
from hmt.runtime.settings import Budgets
from hmt.serve.deciding.costs import mu_from_battery
from hmt.serve.deciding.monitor import ResourceSample
from hmt.serve.deciding.optimizer import REASON_BEST, Choice, Decision, Optimizer

_CACHE_MAX_ENTRIES = 4096


class DecisionPath:
    """Feasible set -> cached choice over one optimizer table (see the module docstring)."""

    def __init__(self, optimizer: Optimizer, fixed_variant: str | None = None, score_margin: float = 0.0) -> None:
        self.optimizer = optimizer
        self.fixed_variant = fixed_variant
        self.score_margin = score_margin  # the switcher's: within it, the home variant is offered
        self._fixed_index = optimizer.position(fixed_variant) if fixed_variant is not None else -1
        self._energy0 = [v.energy_mj for v in optimizer.variants]
        self.enabled = True  # False: every decision recomputed (the ablation, and tests)
        self.hits = 0
        self._choices: dict[tuple[Any, ...], Choice] = {}
        self._mu: dict[tuple[float | None, bool | None], float] = {}
        self._mask_key: tuple[Any, ...] | None = None
        self._mask: tuple[int, int] = (0, 0)
        # The estimates behind the last feasible set: latencies, their ratios to the prior, load scale.
        self.inputs: tuple[list[float], list[float], float] = ([], [], 1.0)

    @property
    def entries(self) -> int:
        return len(self._choices)

    def mu(self, sample: ResourceSample) -> float:
        """Eq. 3's accuracy weight from the sample's battery reading (cached per reading)."""
        key = (sample.battery_percent, sample.battery_plugged)
        mu = self._mu.get(key)
        if mu is None:
            if len(self._mu) > 512:
                self._mu.clear()
            mu = self._mu[key] = mu_from_battery(sample.battery_percent, sample.battery_plugged,
                                                 self.optimizer.config)
        return mu

    def feasible(self, latencies: list[float], ratios: list[float], load_next: float, latency_limit_ms: float,
                 budgets: Budgets, newest_s: list[float] | None = None) -> tuple[int, int]:
        """(feasible mask, fallback) for these estimates (the estimator's cached lists: the same
        objects until they change) within the budgets, with ``latency_limit_ms`` the compute share.
        ``newest_s`` (each variant's newest sample): when nothing is feasible, the fallback is
        :meth:`Optimizer.fallback` (the profile's fastest unless newer evidence overrules it),
        recomputed on every call, as those times move with every request."""
        key = (latencies, latency_limit_ms, budgets, load_next)
        if key != self._mask_key:
            optimizer = self.optimizer
            energies = None
            if budgets.energy is not None:
                energies = self.energies(ratios, load_next)
            self._mask = optimizer.feasible_mask(latencies, energies, latency_limit_ms, budgets.memory_bytes,
                                                 budgets.energy)
            self._mask_key = key
            self.inputs = (latencies, ratios, 1.0 + optimizer.alpha_latency * load_next)
        mask, fallback = self._mask
        if mask == 0 and fallback >= 0 and newest_s is not None:
            return mask, self.optimizer.fallback(latencies, newest_s, budgets.memory_bytes)
        return self._mask

    def energies(self, ratios: list[float], load_next: float) -> list[float]:
        """Energy per inference of every variant: profiled x load model x the latency ratio (energy
        is power times time, so a variant slower than predicted costs more than predicted)."""
        scale = 1.0 + self.optimizer.alpha_energy * load_next
        return [e * scale * r for e, r in strict_zip(self._energy0, ratios)]

    def choose(self, mask: tuple[int, int], mu: float, active: str | None, home: str | None = None) -> Choice:
        """Eq. 3 over the feasible set, scoring the active variant; cached per (mask, mu, active,
        home). ``home`` (the switcher's: the variant left on a violation) is offered instead of
        eq. 3's best when it is feasible and the best does not beat it by ``score_margin``."""
        key = (mask, mu, active, home)
        choice = self._choices.get(key) if self.enabled else None
        if choice is not None:
            self.hits += 1
            return choice
        optimizer = self.optimizer
        choice = optimizer.choose_mask(mask[0], mask[1], mu, -1 if active is None else optimizer.position(active))
        if self.fixed_variant is not None and choice.arch_id != self.fixed_variant:
            pos = self._fixed_index
            choice = choice._replace(arch_id=self.fixed_variant, position=pos, score=optimizer.scores(mu)[pos])
        elif home is not None and home != active and home != choice.arch_id and choice.reason_code == REASON_BEST:
            pos = optimizer.position(home)
            home_score = optimizer.scores(mu)[pos]
            if mask[0] >> pos & 1 and choice.score < home_score + self.score_margin:
                choice = choice._replace(arch_id=home, position=pos, score=home_score)
        if len(self._choices) >= _CACHE_MAX_ENTRIES:
            self._choices.clear()
        self._choices[key] = choice
        return choice

    def record(self, choice: Choice, load_next: float, latency_limit_ms: float, mu: float,
               budgets: Budgets) -> Decision:
        """The full :class:`Decision` of the choice just made (after the timed part)."""
        latencies, ratios, load_scale = self.inputs
        optimizer = self.optimizer
        request_budget_ms = budgets.latency_ms
        if math.isfinite(latency_limit_ms):
            budgets = replace(budgets, latency_ms=latency_limit_ms)
        decision = optimizer.decision_of(choice, latencies, self.energies(ratios, load_next), mu=mu, budgets=budgets,
                                         load_index=load_next, latency_scale=load_scale)
        decision = replace(decision, request_budget_ms=request_budget_ms)
        if self.fixed_variant is not None and choice.reason_code == REASON_BEST:
            # A static baseline is "feasible" when the fixed variant itself meets the budgets.
            i = choice.position
            memory_bytes = budgets.memory_bytes
            decision = replace(decision, feasible=latencies[i] <= latency_limit_ms
                               and (memory_bytes is None or optimizer.variants[i].memory_bytes <= memory_bytes))
        return decision
