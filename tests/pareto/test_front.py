"""Dominance, front extraction, hypervolume and budget misses on points known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hmt.pareto.front import (
    budget_excess,
    closest_to_budgets,
    dominates,
    front_indices,
    hypervolume,
    non_dominated_mask,
)


def test_dominance_is_strict_and_componentwise() -> None:
    assert dominates([1, 1], [2, 2])
    assert dominates([1, 2], [1, 3])
    assert not dominates([1, 2], [1, 2])  # equal points do not dominate each other
    assert not dominates([1, 3], [2, 2])  # a trade-off
    assert not dominates([2, 2], [1, 1])


def test_front_of_known_points() -> None:
    # (-accuracy, latency): minimise both.
    points = np.array([
        [-0.90, 10.0],  # 0 front (most accurate)
        [-0.85, 5.0],   # 1 front
        [-0.80, 6.0],   # 2 dominated by 1
        [-0.70, 2.0],   # 3 front (fastest)
        [-0.85, 5.0],   # 4 equal to 1: stays
        [-0.60, 2.0],   # 5 dominated by 3
        [-0.90, 11.0],  # 6 dominated by 0
    ])
    assert front_indices(points).tolist() == [0, 1, 3, 4]
    assert non_dominated_mask(np.zeros((0, 2))).tolist() == []
    assert non_dominated_mask([[1.0, 2.0, 3.0]]).tolist() == [True]


def test_front_matches_brute_force_on_random_points() -> None:
    rng = np.random.default_rng(0)
    points = rng.integers(0, 6, size=(300, 3)).astype(float)  # many ties
    expected = [i for i in range(len(points)) if not any(dominates(points[j], points[i]) for j in range(len(points)))]
    assert front_indices(points).tolist() == expected


def test_front_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN"):
        non_dominated_mask([[0.0, float("nan")]])


def test_hypervolume_two_objectives_by_hand() -> None:
    # Rectangles to the reference (0, 10): (0-(-0.9))*(10-8) + (0.9-0.8)... staircase.
    points = [[-0.9, 8.0], [-0.8, 4.0], [-0.5, 1.0]]
    ref = [0.0, 10.0]
    expected = 0.9 * 2 + 0.8 * 4 + 0.5 * 3
    assert hypervolume(points, ref) == pytest.approx(expected)
    # A dominated point or one outside the reference adds nothing.
    assert hypervolume([*points, [-0.7, 9.0], [0.1, 0.5]], ref) == pytest.approx(expected)
    assert hypervolume([], ref) == 0.0


def test_hypervolume_three_objectives_matches_monte_carlo() -> None:
    rng = np.random.default_rng(1)
    points = rng.random((8, 3))
    ref = np.ones(3)
    samples = rng.random((200_000, 3))
    dominated = np.zeros(len(samples), dtype=bool)
    for p in points:
        dominated |= np.all(samples >= p, axis=1)
    assert hypervolume(points, ref) == pytest.approx(dominated.mean(), abs=5e-3)


def test_budget_excess_and_closest() -> None:
    rows = [{"latency_ms": 12.0, "memory_mb": 1.0}, {"latency_ms": 11.0, "memory_mb": 3.0},
            {"latency_ms": 10.5, "memory_mb": 2.1}]
    budgets = {"latency_ms": 10.0, "memory_mb": 2.0}
    assert budget_excess(rows[0], budgets) == pytest.approx({"latency_ms": 0.2})
    miss = closest_to_budgets(rows, budgets)
    assert miss is not None and miss.index == 2
    assert miss.worst_excess == pytest.approx(0.05)
    assert closest_to_budgets([], budgets) is None
