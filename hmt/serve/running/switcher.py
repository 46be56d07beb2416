"""Hysteresis between the optimizer's proposals and the variant actually serving.

Rules, applied to each :class:`~hmt.serve.deciding.optimizer.Decision` (one per tick):

- nothing is active yet: adopt the proposal;
- the active variant violates the budgets (``current_feasible`` is False) for
  ``violation_patience`` consecutive decisions, or for one decision when the requests
  themselves confirm it (``confirmed``: the controller saw ``miss_streak`` requests in a
  row over the budget): switch to the proposal at once, dwell time or not (getting back
  within budget comes first; the patience filters one-tick spikes that no request felt).
  This is the fast attack; the slow release is the next rule;
- otherwise switch only when the same proposal has beaten the active variant's score
  by at least ``score_margin`` for ``improve_patience`` consecutive decisions and the
  active variant has served for at least ``min_dwell_s`` (a streak that counted climbs to
  different variants was tried: on ONNX Runtime it switched more, 24 against 6 switches over
  the same 18 phases of the scenario matrix, for no phase tracked better:
  ``benchmarks/serve/results/matrix_patience_ab_*.json``); with ``probe_backoff_max_s`` set,
  a variant reached that way which violated the budgets within two dwell times (a failed
  probe) needs twice the dwell before the next climb to it (up to the cap), until it holds.

- the *home*: the variant the loop left on a violation (the first of a chain of them) is where
  the hysteresis would have kept it had the load not come. When the decision offers it again
  (:class:`~hmt.serve.deciding.decision.DecisionPath` does so once it is feasible and no variant beats it
  by ``score_margin``) it is climbed back to like an improvement (patience and dwell), without
  the margin: reaching it, or a switch on score to a variant that scores at least what the home
  scored when it was left, forgets it (a climb to a variant below it is part of the way back:
  after a memory squeeze the loop may step to a middle variant first), and a return that violates
  again within two dwell times is not tried again. Without this, a loop that left the
  largest variant under load stayed on a variant eq. 3 now scores within the margin of it (a
  falling battery), while the same loop unloaded stayed on the largest: the accuracy lost was
  the path, not the load.

Inputs that alternate between two states therefore never switch back and forth: each
state resets the other's streak, and a budget violation that clears every other tick
never reaches its patience (given patiences of 2 or more).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from hmt.errors import UsageError
from hmt.runtime.settings import SwitchPolicy
from hmt.serve.deciding.optimizer import Choice, Decision

SWITCH_INITIAL = "initial"
SWITCH_VIOLATION = "budget_violation"
SWITCH_MISSES = "budget_violation_confirmed_by_misses"
SWITCH_BETTER = "better_by_margin"
SWITCH_HOME = "back_to_home"  # back to the variant left on a violation, once it fits again
STAY_SAME = "same_variant"
STAY_VIOLATION_PENDING = "violation_pending"
STAY_IMPROVEMENT_PENDING = "improvement_pending"
STAY_BELOW_MARGIN = "below_margin"
STAY_DWELL = "min_dwell"


class SwitchResult(NamedTuple):
    """Outcome of one decision: which variant serves now and why."""

    switched: bool
    active_arch_id: str
    previous_arch_id: str | None
    proposed_arch_id: str
    reason: str


class Switcher:
    """Keeps the active variant; ``offer`` each decision, ``revert`` a switch whose load failed."""

    def __init__(self, policy: SwitchPolicy | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy if policy is not None else SwitchPolicy()
        self._clock = clock
        self.active_arch_id: str | None = None
        self._since_s = 0.0
        self._violations = 0
        self._candidate: str | None = None
        self._candidate_streak = 0
        self.switch_count = 0
        self._stay_same: SwitchResult | None = None  # the steady state's result, built once per variant
        # Probe backoff (policy.probe_backoff_max_s > 0): the dwell before climbing to each variant
        # that failed right after an improvement switch to it.
        self._probe_dwell: dict[str, float] = {}
        self._entered_better = False
        self.home: str | None = None  # the variant left on a violation (see the module docstring)
        self._home_score: float | None = None  # its score when it was left
        self._entered_home = False

    def _switch(self, decision: Decision | Choice, now_s: float, reason: str) -> SwitchResult:
        previous = self.active_arch_id
        cap_s = self.policy.probe_backoff_max_s
        if cap_s > 0 and previous is not None and reason in (SWITCH_VIOLATION, SWITCH_MISSES):
            # Left on a violation: a failed probe when it was entered as an improvement and did not
            # hold for two dwell times (the next climb to it waits twice as long), else a new load
            # step (its backoff is forgotten).
            dwell_s = self.policy.min_dwell_s
            if self._entered_better and now_s - self._since_s < 2 * dwell_s:
                self._probe_dwell[previous] = min(cap_s, 2 * max(dwell_s, self._probe_dwell.get(previous, dwell_s)))
            else:
                self._probe_dwell.pop(previous, None)
        self._entered_better = reason in (SWITCH_BETTER, SWITCH_HOME)
        if reason in (SWITCH_VIOLATION, SWITCH_MISSES):
            # A way home that failed within two dwell times is not offered again: on a budget at
            # the edge of the home variant the loop would go home and fall back every dwell.
            failed_return = self._entered_home and now_s - self._since_s < 2 * self.policy.min_dwell_s
            if self.home is None and not failed_return:
                self.home, self._home_score = previous, decision.current_score
        elif reason == SWITCH_HOME or (reason == SWITCH_BETTER and not self._below_home(decision)):
            self.home = None  # home reached, or a choice on score at its level or above
        if self.home == decision.arch_id:
            self.home = None
        self._entered_home = reason == SWITCH_HOME
        self.active_arch_id = decision.arch_id
        self._since_s = now_s
        self._violations = 0
        self._candidate = None
        self._candidate_streak = 0
        self.switch_count += previous is not None
        return SwitchResult(True, decision.arch_id, previous, decision.arch_id, reason)

    def _below_home(self, decision: Decision | Choice) -> bool:
        """Whether ``decision`` climbs to a variant that scores under the home as it was left."""
        return self.home is not None and self._home_score is not None and decision.score < self._home_score

    def _stay(self, decision: Decision | Choice, reason: str) -> SwitchResult:
        assert self.active_arch_id is not None
        return SwitchResult(False, self.active_arch_id, self.active_arch_id, decision.arch_id, reason)

    def offer(self, decision: Decision | Choice, now_s: float | None = None, *,
              confirmed: bool = False) -> SwitchResult:
        """Apply the rules to ``decision`` (or the loop's :class:`Choice`), which must score the
        active variant (``current_arch_id``). ``confirmed``: requests in a row missed the budget,
        so a violation needs no patience."""
        active = self.active_arch_id
        if active is None:
            return self._switch(decision, self._clock() if now_s is None else now_s, SWITCH_INITIAL)
        if decision.current_arch_id != active or decision.current_score is None:
            raise UsageError(
                f"decision scores {decision.current_arch_id!r}, but the active variant is {active!r}: "
                "pass current_arch_id=switcher.active_arch_id to Optimizer.decide"
            )
        if decision.arch_id == active:
            # The steady state: nothing to reset, no allocation but the result.
            if self._violations or self._candidate is not None:
                self._violations = 0
                self._candidate, self._candidate_streak = None, 0
            stay = self._stay_same
            if stay is None or stay.active_arch_id is not active:
                stay = self._stay_same = SwitchResult(False, active, active, active, STAY_SAME)
            return stay
        now = self._clock() if now_s is None else now_s
        if decision.current_feasible is False:
            self._violations += 1
            self._candidate, self._candidate_streak = None, 0
            if self._violations >= self.policy.violation_patience:
                return self._switch(decision, now, SWITCH_VIOLATION)
            if confirmed:
                return self._switch(decision, now, SWITCH_MISSES)
            return self._stay(decision, STAY_VIOLATION_PENDING)
        self._violations = 0
        home = decision.arch_id == self.home
        if not home and decision.score < decision.current_score + self.policy.score_margin:
            self._candidate, self._candidate_streak = None, 0
            return self._stay(decision, STAY_BELOW_MARGIN)
        if decision.arch_id == self._candidate:
            self._candidate_streak += 1
        else:
            self._candidate, self._candidate_streak = decision.arch_id, 1
        if self._candidate_streak < self.policy.improve_patience:
            return self._stay(decision, STAY_IMPROVEMENT_PENDING)
        dwell_s = self.policy.min_dwell_s
        if self._probe_dwell:
            dwell_s = max(dwell_s, self._probe_dwell.get(decision.arch_id, 0.0))
        if now - self._since_s < dwell_s:
            return self._stay(decision, STAY_DWELL)
        return self._switch(decision, now, SWITCH_HOME if home else SWITCH_BETTER)

    def revert(self, result: SwitchResult) -> None:
        """Undo ``result`` (the new variant failed to load): the previous one keeps serving."""
        if not result.switched or result.active_arch_id != self.active_arch_id:
            raise UsageError("only the latest switch can be reverted")
        self.active_arch_id = result.previous_arch_id
        if self.home == self.active_arch_id:
            self.home = None
        self._violations = 0
        self._candidate, self._candidate_streak = None, 0
        if result.previous_arch_id is not None:
            self.switch_count -= 1
