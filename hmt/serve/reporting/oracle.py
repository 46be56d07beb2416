"""The best static choice in hindsight: what the adaptive loop is measured against (issue 28).

The same scenario is replayed once per bundled variant, each served alone (``serve --variant``),
and once adaptively. Per phase of the scenario (the interval between two of its rows' times):

- each run's *deadline-miss share* over the requests sent in the phase (judged against the
  budget in force when sent, failures count as misses) and its *accuracy*: the share of
  labelled requests answered right when the inputs carry labels, and the *table accuracy*,
  the bundle's measured accuracy of the variant that answered each request (its mean over the
  phase; free of which images happened to fall in the phase, so runs compare on the variant
  choice alone);
- the *oracle* of the phase is the most accurate variant (by the table) whose static run missed
  at most ``max_miss_share`` of the phase's deadlines; where none did, the one with the fewest
  misses. Where the loop's own objective was not accuracy alone (a battery below full: eq. 3
  weighs energy by ``1 - mu``, :func:`phase_mu`), "best" is the loop's objective: the variant of
  the highest eq. 3 score at the phase's ``mu`` among those meeting the budget (``ranking``), so a
  low-battery phase in which the loop trades points for energy on purpose is judged against
  the static choice that makes the same trade. Only variants within the phase's memory budget
  compete (the budget the adaptive loop had: the configured one, cut to the free memory with
  serve.json ``memory_reserve_mb``); where none fits, the variant of least memory (what serve
  runs then).

A phase in which the adaptive run sent no request (shorter than the gap between two requests, or
than ``warmup_s``) shows nothing about it: its row says ``sent`` 0 and neither tracks nor meets.

The adaptive run *tracks* the oracle in a phase when its miss share is at most the oracle's plus
``miss_slack`` and its table accuracy at least the oracle's less ``accuracy_slack``.

A phase without a latency budget (no deadline to judge: a memory or battery scenario) has its
deadlines met by every run that answered in it: there the oracle is chosen by accuracy (or eq. 3)
among all the variants within memory, and the runs are compared on accuracy and memory alone.

A run *meets the budgets* of a phase when it missed at most ``max_miss_share`` of the phase's
deadlines and answered at most that share of its requests with a variant over the phase's memory
budget (where no variant fits, the one of least memory counts as within it: serve can do no
better). The static largest ignores a memory budget; the adaptive loop does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hmt.compat import strict_zip
from hmt.serve.running.scenario import RequestRecord

MAX_MISS_SHARE = 0.05  # a variant "meets" a phase with at most this share of misses
MISS_SLACK = 0.05  # the adaptive run may miss this much more than the oracle (share)
ACCURACY_SLACK = 0.02  # and lose this much table accuracy (share)


@dataclass(frozen=True)
class PhaseScore:
    """One run over one phase."""

    start_s: float
    stop_s: float
    judged: int
    misses: int
    miss_share: float | None  # None: no judged request in the phase
    accuracy: float | None  # labelled requests answered right (None: no labels)
    table_accuracy: float | None  # mean of the bundle's accuracy of the variant that answered each request
    variants: dict[str, int]  # requests answered per variant
    requests: int = 0  # requests sent in the phase, answered or not


def _missed(r: RequestRecord) -> bool:
    assert r.latency_budget_ms is not None
    return not r.ok or r.latency_ms is None or r.latency_ms > r.latency_budget_ms


def phase_bounds(step_times: Sequence[float], end_s: float) -> list[tuple[float, float]]:
    """(start, stop) of each phase: from each row time before ``end_s`` to the next (or the end)."""
    starts = sorted({t for t in step_times if t < end_s} | {0.0})
    return [(a, b) for a, b in strict_zip(starts, [*starts[1:], end_s]) if b > a]


def phase_scores(records: Sequence[RequestRecord], bounds: Sequence[tuple[float, float]],
                 table: Mapping[str, float], warmup_s: float = 0.0) -> list[PhaseScore]:
    """Each phase's score of one run. ``table``: each variant's accuracy in the bundle (with early exit
    on, a request that left at an earlier exit counts at its variant's accuracy: the bundle's is the
    variant's as served, and an exit's own table entry is its accuracy on every input, not on the
    confident ones that leave there).
    ``warmup_s``: requests sent this soon after a phase starts are left out of that phase (0: none)."""
    out = []
    for start, stop in bounds:
        rows = [r for r in records if start + warmup_s <= r.time_s < stop]
        judged = [r for r in rows if r.latency_budget_ms is not None]
        misses = sum(_missed(r) for r in judged)
        labelled = [r for r in rows if r.ok and r.label is not None]
        known = [table[r.variant] for r in rows if r.ok and r.variant is not None and r.variant in table]
        variants: dict[str, int] = {}
        for r in rows:
            if r.ok and r.variant is not None:
                variants[r.variant] = variants.get(r.variant, 0) + 1
        out.append(PhaseScore(
            start_s=start, stop_s=stop, judged=len(judged), misses=misses,
            miss_share=misses / len(judged) if judged else None,
            accuracy=sum(r.predicted == r.label for r in labelled) / len(labelled) if labelled else None,
            table_accuracy=sum(known) / len(known) if known else None, variants=variants, requests=len(rows)))
    return out


def meets_deadlines(score: PhaseScore, max_miss_share: float = MAX_MISS_SHARE) -> bool:
    """Whether a run missed at most ``max_miss_share`` of a phase's deadlines; a phase none of whose
    requests had a latency budget has no deadline to miss: met when the run answered there."""
    if score.judged == 0:
        return sum(score.variants.values()) > 0
    return score.miss_share is not None and score.miss_share <= max_miss_share


def over_memory_share(score: PhaseScore, memory_mb: Mapping[str, float] | None, limit_mb: float | None) -> float:
    """The share of a run's answers in a phase given by a variant over the phase's memory budget
    ``limit_mb`` (None: no budget, 0.0). Where no variant of ``memory_mb`` fits, the one(s) of least
    memory count as within it; a variant without a footprint in ``memory_mb`` is not counted."""
    answered = sum(score.variants.values())
    if memory_mb is None or limit_mb is None or not answered:
        return 0.0
    allowed = set(_within_memory(list(memory_mb), memory_mb, limit_mb))
    return sum(n for v, n in score.variants.items() if v in memory_mb and v not in allowed) / answered


def meets_budgets(score: PhaseScore, memory_mb: Mapping[str, float] | None, limit_mb: float | None,
                  max_miss_share: float = MAX_MISS_SHARE) -> bool:
    """Whether a run met a phase's budgets (see the module docstring)."""
    return (meets_deadlines(score, max_miss_share)
            and over_memory_share(score, memory_mb, limit_mb) <= max_miss_share)


def _within_memory(names: Sequence[str], memory_mb: Mapping[str, float] | None, limit_mb: float | None) -> list[str]:
    """The variants within ``limit_mb``; none fits: the variant(s) of least memory."""
    if memory_mb is None or limit_mb is None:
        return list(names)
    fits = [v for v in names if memory_mb[v] <= limit_mb]
    least = min(memory_mb[v] for v in names)
    return fits if fits else [v for v in names if memory_mb[v] == least]


def oracle_choice(static: Mapping[str, Sequence[PhaseScore]], accuracy: Mapping[str, float],
                  max_miss_share: float = MAX_MISS_SHARE, *, memory_mb: Mapping[str, float] | None = None,
                  phase_memory_mb: Sequence[float | None] | None = None,
                  ranking: Sequence[Mapping[str, float] | None] | None = None) -> list[str]:
    """Per phase, the oracle variant (see the module docstring). ``static``: each variant's run;
    ``accuracy``: each variant's accuracy in the bundle's table (the ranking); ``memory_mb``: each
    variant's footprint and ``phase_memory_mb`` each phase's memory budget (None: unconstrained);
    ``ranking``: per phase, the loop's objective per variant where it was not accuracy (None: accuracy)."""
    phases = len(static[next(iter(static))])
    out = []
    for k in range(phases):
        names = _within_memory(list(static), memory_mb, phase_memory_mb[k] if phase_memory_mb else None)
        shares = {v: static[v][k].miss_share for v in names}
        meeting = [v for v in names if meets_deadlines(static[v][k], max_miss_share)]
        rank = (ranking[k] if ranking else None) or accuracy
        if meeting:
            out.append(max(meeting, key=lambda v: (rank[v], accuracy[v], -(shares[v] or 0.0))))
        else:
            out.append(min(names, key=lambda v: (1.0 if shares[v] is None else shares[v], -accuracy[v])))
    return out


def compare(adaptive: Sequence[PhaseScore], static: Mapping[str, Sequence[PhaseScore]],
            accuracy: Mapping[str, float], *, largest: str, max_miss_share: float = MAX_MISS_SHARE,
            miss_slack: float = MISS_SLACK, accuracy_slack: float = ACCURACY_SLACK,
            memory_mb: Mapping[str, float] | None = None,
            phase_memory_mb: Sequence[float | None] | None = None,
            ranking: Sequence[Mapping[str, float] | None] | None = None,
            mu: Sequence[float | None] | None = None) -> list[dict[str, Any]]:
    """Per phase: the adaptive run, the oracle (its variant and run) and the static largest, and
    whether the adaptive run tracks the oracle (see the module docstring; ``memory_mb``,
    ``phase_memory_mb`` and ``ranking``: :func:`oracle_choice`; ``mu``: each phase's eq. 3 weight,
    recorded with the row)."""
    choices = oracle_choice(static, accuracy, max_miss_share, memory_mb=memory_mb, phase_memory_mb=phase_memory_mb,
                            ranking=ranking)
    rows = []
    for k, (mine, best) in enumerate(strict_zip(adaptive, choices)):
        oracle_run = static[best][k]
        if mine.judged == 0 and oracle_run.judged == 0:  # no latency budget in the phase: no deadline
            miss_ok = meets_deadlines(mine, max_miss_share)
        else:
            miss_ok = (mine.miss_share is not None and oracle_run.miss_share is not None
                       and mine.miss_share <= oracle_run.miss_share + miss_slack)
        acc_ok = (mine.table_accuracy is not None and oracle_run.table_accuracy is not None
                  and mine.table_accuracy >= oracle_run.table_accuracy - accuracy_slack)
        limit = phase_memory_mb[k] if phase_memory_mb else None
        met = {name: meets_budgets(run, memory_mb, limit, max_miss_share)
               for name, run in (("adaptive", mine), ("oracle", oracle_run), ("static_largest", static[largest][k]))}
        rows.append({"start_s": mine.start_s, "stop_s": mine.stop_s, "sent": mine.requests, "oracle_variant": best,
                     "memory_budget_mb": limit, "budgets_met": met,
                     "mu": mu[k] if mu else None,
                     "oracle_by": "eq. 3" if ranking and ranking[k] else "accuracy",
                     "adaptive": asdict(mine), "oracle": asdict(oracle_run),
                     "static_largest": asdict(static[largest][k]),
                     "misses_within_slack": miss_ok, "accuracy_within_slack": acc_ok,
                     "tracks_oracle": miss_ok and acc_ok})
    return rows


def _phase_medians(ticks: Sequence[Any], bounds: Sequence[tuple[float, float]], field: str) -> list[float | None]:
    """Per phase, the median of the decisions' ``field`` (a TickRecord attribute) there; None where
    none had it."""
    out: list[float | None] = []
    for start, stop in bounds:
        values = sorted(getattr(t, field) for t in ticks
                        if start <= t.time_s < stop and getattr(t, field) is not None)
        out.append(values[len(values) // 2] if values else None)
    return out


def phase_memory_budgets(ticks: Sequence[Any], bounds: Sequence[tuple[float, float]]) -> list[float | None]:
    """Each phase's memory budget as the loop had it: the median of its decisions' memory budget
    (``TickRecord.memory_budget_mb``) in the phase; None where unconstrained."""
    return _phase_medians(ticks, bounds, "memory_budget_mb")


def phase_mu(ticks: Sequence[Any], bounds: Sequence[tuple[float, float]]) -> list[float | None]:
    """Each phase's eq. 3 weight as the loop had it: the median ``TickRecord.mu`` of its decisions in
    the phase (None where it made none)."""
    return _phase_medians(ticks, bounds, "mu")
