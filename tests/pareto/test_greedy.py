"""The greedy shrinking path: cheapest loss per cost saved, stops at the drop bound."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from hmt.errors import UsageError
from hmt.pareto.greedy import greedy_path, single_changes
from hmt.supernet.space import ArchConfig, BlockPosition, SearchSpace

# Made-up per-choice costs and accuracy losses: "w50" on s0.b0 is nearly free, "skip" on s0.b1
# is cheap per unit saved, "lr50" on s1.b0 is the worst trade.
COST = {"base": 10.0, "w50": 5.0, "lr50": 6.0, "skip": 0.0, "merge": 4.0}
LOSS = {("s0.b0", "w50"): 0.001, ("s0.b0", "lr50"): 0.02, ("s0.b0", "skip"): 0.2, ("s0.b0", "merge"): 0.3,
        ("s0.b1", "w50"): 0.01, ("s0.b1", "skip"): 0.015, ("s1.b0", "lr50"): 0.05}


def _space() -> SearchSpace:
    return SearchSpace(
        backbone="toy", num_classes=10, input_shape=(3, 8, 8), num_stages=2,
        positions=(
            BlockPosition("s0.b0", 0, 0, "basic", 4, 4, 1, ("base", "w50", "lr50", "skip", "merge")),
            BlockPosition("s0.b1", 0, 1, "basic", 4, 4, 1, ("base", "w50", "skip")),
            BlockPosition("s1.b0", 1, 0, "basic", 4, 8, 2, ("base", "lr50")),
        ),
    )


def _cost(arch: ArchConfig) -> float:
    return sum(COST[c] for c in arch.choices if c != "-")


def _accuracy(space: SearchSpace, calls: list[int]):  # type: ignore[no-untyped-def]
    def fn(archs: Sequence[ArchConfig]) -> list[float]:
        calls.append(len(archs))
        return [0.9 - sum(LOSS.get((p.name, c), 0.0) for p, c in zip(space.positions, a.choices, strict=True))
                for a in archs]
    return fn


def test_single_changes_are_one_block_and_canonical() -> None:
    space = _space()
    start = space.largest()
    changes = single_changes(space, start)
    ids = {a.arch_id for a in changes}
    assert len(ids) == len(changes)
    assert start.arch_id not in ids
    for arch in changes:
        differing = [i for i, (a, b) in enumerate(zip(arch.choices, start.choices, strict=True)) if a != b]
        # "merge" covers the next block too, so it changes two positions
        assert len(differing) == (2 if "merge" in arch.choices else 1)


def test_path_takes_the_cheapest_loss_per_cost_saved_first() -> None:
    space = _space()
    calls: list[int] = []
    path = greedy_path(space, _accuracy(space, calls), _cost, max_drop=0.03, max_evaluations=100)
    assert path[0].arch == space.largest()
    steps = [a.arch.choices for a in path]
    # 1st: s0.b0 -> w50 (0.001 lost for 5 saved); 2nd: s0.b1 -> skip (0.015 for 10) beats w50 (0.01 for 5)
    assert steps[1] == ("w50", "base", "base")
    assert steps[2] == ("w50", "skip", "base")
    costs = [s.cost for s in path]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    assert all(path[0].accuracy - s.accuracy <= 0.03 + 1e-12 for s in path)
    # the next step (s1.b0 -> lr50: 0.05 more) would break the bound, so the walk stopped
    assert len(path) == 3
    assert path[-1].evaluations == sum(calls[:-1])  # the last round was evaluated, then refused


def test_evaluation_budget_is_a_bound() -> None:
    space = _space()
    calls: list[int] = []
    path = greedy_path(space, _accuracy(space, calls), _cost, max_drop=1.0, max_evaluations=4)
    assert sum(calls) <= 4
    assert path[-1].evaluations <= 4


def test_bad_arguments_are_refused() -> None:
    space = _space()
    with pytest.raises(UsageError, match="max drop"):
        greedy_path(space, _accuracy(space, []), _cost, max_drop=-0.1)
    with pytest.raises(UsageError, match="max evaluations"):
        greedy_path(space, _accuracy(space, []), _cost, max_evaluations=0)


def test_path_on_a_trained_supernet_with_the_prefix_evaluator(tiny_loaded) -> None:  # type: ignore[no-untyped-def]
    from hmt.pareto.data import calibration_batches, device_batches, held_out_data
    from hmt.pareto.evaluate import PrefixEvaluator

    net = tiny_loaded.net
    data = held_out_data(tiny_loaded, max_samples=64)
    evaluator = PrefixEvaluator(net, device_batches(data, batch_size=64),
                                calibration=calibration_batches(tiny_loaded, max_samples=64))

    def parameters(arch: ArchConfig) -> float:
        return float(sum(p.numel() for p in net.materialize(arch).parameters()))

    path = greedy_path(net.space, lambda archs: [r.accuracy for r in evaluator.evaluate(archs)], parameters,
                       max_drop=1.0, max_evaluations=40)
    assert len(path) >= 2
    assert all(b.cost < a.cost for a, b in itertools.pairwise(path))
    assert path[0].accuracy == evaluator.evaluate([net.space.largest()])[0].accuracy
    assert path[-1].evaluations <= 40


def test_next_moves_take_one_candidate_per_block() -> None:
    from hmt.pareto.greedy import next_cheaper

    space = _space()
    moves = next_cheaper(space, space.largest(), _cost)
    # s0.b0: the cheapest step down from base (10) is lr50 (6); s0.b1: w50 (5); s1.b0: lr50 (6)
    assert [a.choices for a, _ in moves] == [("lr50", "base", "base"), ("base", "w50", "base"),
                                             ("base", "base", "lr50")]
    path = greedy_path(space, _accuracy(space, []), _cost, max_drop=1.0, moves="next")
    assert all(b.cost < a.cost for a, b in itertools.pairwise(path))
    with pytest.raises(UsageError, match="moves"):
        greedy_path(space, _accuracy(space, []), _cost, moves="some")
