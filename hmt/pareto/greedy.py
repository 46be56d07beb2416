"""A greedy shrinking path through a search space (NetAdapt-style).

Random variants of an elastic space mostly change many blocks at once and land far below the
largest variant's accuracy, so a table of random samples says little about the variants a
user wants most: the ones a little cheaper than the original at almost its accuracy. This
walks from the largest variant towards cheaper ones, one block at a time: at every step it
evaluates each single-block change that lowers the cost, and takes the one that loses the
least accuracy per unit of cost saved. The walk stops when the best step would fall more
than ``max_drop`` below the start, when nothing cheaper is left, or when the evaluation
budget is spent.

It needs only two callables, so it serves any space (built-in or elastified supernets) and
any evaluator (``PrefixEvaluator`` on held-out batches, a proxy in tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hmt.errors import UsageError
from hmt.supernet.space import ArchConfig, SearchSpace

AccuracyFn = Callable[[Sequence[ArchConfig]], list[float]]
CostFn = Callable[[ArchConfig], float]


@dataclass(frozen=True)
class PathStep:
    arch: ArchConfig
    accuracy: float  # fraction, from ``accuracy``
    cost: float  # the caller's unit (MACs, predicted ms)
    evaluations: int  # evaluated so far, this step's candidates included


def single_changes(space: SearchSpace, arch: ArchConfig) -> list[ArchConfig]:
    """Every architecture that differs from ``arch`` in one position's choice (same exit),
    as the space canonicalises it; those the space refuses are skipped."""
    out: dict[str, ArchConfig] = {}
    for i, pos in enumerate(space.positions):
        for choice in pos.choices:
            if choice == arch.choices[i]:
                continue
            choices = list(arch.choices)
            choices[i] = choice
            try:
                candidate = space.make(choices, arch.exit_stage)
            except UsageError:  # a combination the space does not allow
                continue
            if candidate.arch_id != arch.arch_id:
                out.setdefault(candidate.arch_id, candidate)
    return list(out.values())


def next_cheaper(space: SearchSpace, arch: ArchConfig, cost: CostFn) -> list[tuple[ArchConfig, float]]:
    """Per position, the single change that saves the least cost (the next cheaper choice):
    one candidate per block instead of one per block and choice, so that a deep space
    (ResNet-56: 27 blocks x 5 choices) gets several steps out of a small budget."""
    here = cost(arch)
    best: dict[int, tuple[ArchConfig, float]] = {}
    for candidate in single_changes(space, arch):
        c = cost(candidate)
        if c >= here:
            continue
        i = next(k for k, (a, b) in enumerate(zip(candidate.choices, arch.choices, strict=True)) if a != b)
        if i not in best or c > best[i][1]:
            best[i] = (candidate, c)
    return [best[i] for i in sorted(best)]


def greedy_path(space: SearchSpace, accuracy: AccuracyFn, cost: CostFn, *, start: ArchConfig | None = None,
                max_drop: float = 0.05, max_evaluations: int = 500, moves: str = "all") -> list[PathStep]:
    """The path from ``start`` (default: the largest variant at its last exit), cheapest last.

    ``max_drop``: accuracy (fraction) the path may lose against its start. ``max_evaluations``:
    bound on ``accuracy`` calls' architectures, the start included. ``moves``: ``all`` (every
    cheaper single-block change, NetAdapt's) or ``next`` (:func:`next_cheaper`).
    """
    if moves not in ("all", "next"):
        raise UsageError(f"moves must be all or next, got {moves!r}")
    if max_drop < 0:
        raise UsageError(f"max drop must be >= 0, got {max_drop}")
    if max_evaluations < 1:
        raise UsageError(f"max evaluations must be >= 1, got {max_evaluations}")
    current = start if start is not None else space.largest()
    base_accuracy = accuracy([current])[0]
    evaluations = 1
    path = [PathStep(current, base_accuracy, cost(current), evaluations)]
    while evaluations < max_evaluations:
        here = path[-1]
        cheaper = (next_cheaper(space, here.arch, cost) if moves == "next"
                   else [(a, c) for a in single_changes(space, here.arch) if (c := cost(a)) < here.cost])
        if not cheaper:
            break
        cheaper = cheaper[: max_evaluations - evaluations]
        scores = accuracy([a for a, _ in cheaper])
        evaluations += len(cheaper)
        # Accuracy lost per unit of cost saved; a change that gains accuracy scores below 0.
        (arch, arch_cost), arch_accuracy = min(
            zip(cheaper, scores, strict=True),
            key=lambda t: ((here.accuracy - t[1]) / (here.cost - t[0][1]), t[0][1]))
        if base_accuracy - arch_accuracy > max_drop:
            break
        path.append(PathStep(arch, arch_accuracy, arch_cost, evaluations))
    return path
