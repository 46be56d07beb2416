"""Pareto dominance, front extraction, hypervolume and budget checks (pure numpy).

Every function takes objective vectors to *minimise* (accuracy enters as its negative)
as an (n, m) array. A point dominates another when it is no worse in every objective and
strictly better in at least one; equal points do not dominate each other, so both stay
on the front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def dominates(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> bool:
    """True when ``a`` dominates ``b`` (minimisation)."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return bool(np.all(a_arr <= b_arr) and np.any(a_arr < b_arr))


def non_dominated_mask(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """Boolean mask of the points no other point dominates (minimisation).

    O(n^2 m) in chunks of rows, enough for the thousands of points a search evaluates.
    NaN in a row makes that row dominated by nothing and dominating nothing: refused.
    """
    F = np.asarray(points, dtype=float)
    if F.ndim != 2:
        raise ValueError(f"points must be a 2-D array (n, m), got shape {F.shape}")
    if F.size and not np.all(np.isfinite(F)):
        raise ValueError("points contain NaN or infinite objectives")
    n = len(F)
    mask = np.ones(n, dtype=bool)
    chunk = max(1, 2_000_000 // max(1, n * max(1, F.shape[1])))
    for start in range(0, n, chunk):
        block = F[start:start + chunk]  # (c, m): is row i dominated by any j?
        no_worse = np.all(F[None, :, :] <= block[:, None, :], axis=2)  # (c, n)
        better = np.any(F[None, :, :] < block[:, None, :], axis=2)
        mask[start:start + chunk] = ~np.any(no_worse & better, axis=1)
    return mask


def front_indices(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """Indices of the non-dominated points, in input order."""
    return np.flatnonzero(non_dominated_mask(points))


def hypervolume(points: np.ndarray | Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    """Hypervolume dominated by ``points`` and bounded by ``reference`` (minimisation).

    Points not strictly better than the reference in every objective add nothing. Two
    objectives: the exact sweep; more: pymoo's exact algorithm.
    """
    F = np.asarray(points, dtype=float).reshape(-1, len(reference))
    ref = np.asarray(reference, dtype=float)
    F = F[np.all(ref > F, axis=1)]
    if len(F) == 0:
        return 0.0
    F = F[non_dominated_mask(F)]
    if F.shape[1] == 2:
        F = F[np.argsort(F[:, 0], kind="stable")]
        volume, best_y = 0.0, ref[1]
        for x, y in F:
            if y < best_y:
                volume += (ref[0] - x) * (best_y - y)
                best_y = y
        return float(volume)
    from pymoo.indicators.hv import HV

    return float(HV(ref_point=ref)(F))


@dataclass(frozen=True)
class BudgetMiss:
    """How far a point is from meeting budgets: relative excess per metric (0 = met)."""

    index: int
    excess: dict[str, float]  # metric -> value / budget - 1, only where > 0

    @property
    def worst_excess(self) -> float:
        return max(self.excess.values(), default=0.0)


def budget_excess(values: Mapping[str, float], budgets: Mapping[str, float]) -> dict[str, float]:
    """Relative excess of ``values`` over ``budgets`` (``{metric: v/b - 1}`` where v > b)."""
    out: dict[str, float] = {}
    for metric, budget in budgets.items():
        value = float(values[metric])
        if value > budget:
            out[metric] = value / budget - 1.0 if budget > 0 else float("inf")
    return out


def closest_to_budgets(rows: Sequence[Mapping[str, float]], budgets: Mapping[str, float]) -> BudgetMiss | None:
    """The row that misses ``budgets`` by the least (largest relative excess minimised,
    then the sum of excesses); ``None`` for no rows."""
    best: tuple[float, float, int] | None = None
    best_excess: dict[str, float] = {}
    for i, row in enumerate(rows):
        excess = budget_excess(row, budgets)
        key = (max(excess.values(), default=0.0), sum(excess.values()), i)
        if best is None or key < best:
            best, best_excess = key, excess
    return None if best is None else BudgetMiss(best[2], best_excess)
