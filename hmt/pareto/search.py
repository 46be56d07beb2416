"""Multi-objective search: NSGA-II (pymoo) seeded and mutated near the budgets.

Three methods share one evaluation path, so that they compare at equal budgets:

- ``nearby`` (the default): NSGA-II with AdaptiveNet's NearbyInit (random candidates
  steered into a window just under a budget) and NearbyMutate (replace one branch; if
  that left the band of the budgets, steer back to the nearest budget's window with the
  smallest change), plus CrowdHMTware's noise injection (a share of the offspring get
  Gaussian noise on every gene; genes are ordered by cost, so noise moves a block to a
  neighbouring width / rank / kernel);
- ``evolution``: plain NSGA-II (random initial population, SBX + polynomial mutation);
- ``random``: uniform random candidates;
- ``listed``: no search, exactly the variants named in ``candidates`` (a specialized
  supernet's own list: its other variants share weights with them and were never trained
  for themselves, so a search there finds variants no deployment should run).

The budget is counted in accuracy *evaluations*: distinct variants measured on the
held-out data. Candidates above the loosest budgets are priced (microseconds) but never
evaluated: NSGA-II's constraint domination ranks them by their violation alone. Every
evaluated variant goes into the archive, and so do its earlier exits (measured in the
same pass, so free); the front is taken over the archive.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hmt.errors import UsageError
from hmt.pareto.budgets import BudgetSweep
from hmt.pareto.encoding import Candidate, Encoding
from hmt.pareto.evaluate import ArchAccuracy, PrefixEvaluator
from hmt.pareto.front import budget_excess, front_indices
from hmt.pareto.objectives import COST_METRICS, Costs, VariantCostModel
from hmt.pareto.records import Record, SearchOptions, SearchResult
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.space import ArchConfig


class _Search:
    """The state shared by the operators and the problem: pricing, archive, counters."""

    def __init__(self, encoding: Encoding, costs: VariantCostModel, evaluator: PrefixEvaluator, budgets: BudgetSweep,
                 options: SearchOptions, progress: ProgressCallback) -> None:
        self.encoding = encoding
        self.cost_model = costs
        self.evaluator = evaluator
        self.budgets = budgets
        self.limits = budgets.limits()
        self.targets = budgets.targets()
        self.options = options
        self.progress = progress
        self.archive: dict[str, Record] = {}
        self.records: list[Record] = []
        self.evaluations = 0
        self.priced = 0
        self.infeasible = 0
        self.generation = 0
        self.closest: tuple[tuple[float, float], Candidate, Costs] | None = None  # least budget miss priced
        self.seeds: list[np.ndarray] = []  # genes the initial population starts from (the greedy path)

    # -- pricing ----------------------------------------------------------------------

    def price(self, genes: np.ndarray) -> tuple[Candidate, Costs]:
        candidate = self.encoding.decode(genes)
        return candidate, self.cost_model.costs(candidate.arch)

    def feasible(self, costs: Costs) -> bool:
        return all(costs.metric(m) <= v for m, v in self.limits.items())

    @property
    def remaining(self) -> int:
        return self.options.evaluations - self.evaluations

    # -- evaluation (one group) ---------------------------------------------------------

    def evaluate_genes(self, genes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        X = self.encoding.clip(genes).reshape(len(genes), self.encoding.n_var)
        priced = [self.price(x) for x in X]
        self.priced += len(priced)
        new: dict[str, tuple[Candidate, Costs]] = {}
        for candidate, costs in priced:
            if not self.feasible(costs):
                self.infeasible += 1
                excess = budget_excess(costs.to_json_dict(), self.limits)
                key = (max(excess.values()), sum(excess.values()))
                if self.closest is None or key < self.closest[0]:
                    self.closest = (key, candidate, costs)
            elif candidate.key not in self.archive and candidate.key not in new and len(new) < self.remaining:
                new[candidate.key] = (candidate, costs)
        # A candidate that is an earlier exit of another one of the group comes with it, free:
        # evaluating both would put the same variant twice on the archive (and the front).
        free = {e.key for c, _ in new.values() for e in self._earlier_exits(c)}
        new = {key: value for key, value in new.items() if key not in free}
        if new:
            archs = [c.arch for c, _ in new.values()]
            results = self.evaluator.evaluate(archs)
            for (candidate, costs), accuracy in zip(new.values(), results, strict=True):
                record = Record(self.evaluations, self.generation, candidate, costs, accuracy)
                self.evaluations += 1
                self._add(record)
                self._add_earlier_exits(record)
            best = max(r.accuracy.accuracy for r in self.records)
            self.progress("search", self.evaluations, self.options.evaluations,
                          f"gen {self.generation}, best {100 * best:.1f}%")
        F = np.empty((len(X), len(self.options.objectives)))
        for i, (candidate, costs) in enumerate(priced):
            known = self.archive.get(candidate.key)
            for j, name in enumerate(self.options.objectives):
                if name == "accuracy":
                    F[i, j] = -known.accuracy.accuracy if known is not None else 0.0
                else:
                    F[i, j] = costs.metric(name)
        G = None
        if self.limits:
            G = np.array([[costs.metric(m) / v - 1.0 for m, v in self.limits.items()] for _, costs in priced])
        return F, G

    def greedy_walk(self) -> None:
        """Spend ``greedy_share`` of the evaluations on the greedy path from the largest
        variant; feasible steps and candidates enter the archive, the path seeds the search."""
        from hmt.pareto.greedy import greedy_path

        budget = round(self.options.evaluations * self.options.greedy_share)
        if budget < 2:
            # The largest variant is the user's model: always on the archive, so the front's
            # top end is there even when no search start lands near it.
            self.evaluate_genes(self.encoding.encode(self.encoding.candidate(self.encoding.space.largest()))[None])
            return
        cost_metric = next(o for o in self.options.objectives if o != "accuracy")

        def accuracy(archs: Sequence[ArchConfig]) -> list[float]:
            results = self.evaluator.evaluate(archs)
            for arch, result in zip(archs, results, strict=True):
                candidate = self.encoding.candidate(arch)
                costs = self.cost_model.costs(arch)
                self.evaluations += 1
                if self.feasible(costs) and candidate.key not in self.archive:
                    record = Record(self.evaluations - 1, self.generation, candidate, costs, result)
                    self._add(record)
                    self._add_earlier_exits(record)
            self.progress("search", self.evaluations, self.options.evaluations, "greedy path")
            return [r.accuracy for r in results]

        path = greedy_path(self.encoding.space, accuracy, lambda a: self.cost_model.costs(a).metric(cost_metric),
                           max_drop=self.options.greedy_drop, max_evaluations=budget, moves="next")
        self.seeds = [self.encoding.encode(self.encoding.candidate(step.arch)) for step in path]

    def _add(self, record: Record) -> None:
        self.records.append(record)
        self.archive[record.candidate.key] = record

    def _earlier_exits(self, candidate: Candidate) -> list[Candidate]:
        """The variants that stop at each earlier exit of ``candidate`` (its blocks up to there)."""
        arch = candidate.arch
        choices = [c if c != "-" else "base" for c in arch.choices]
        return [Candidate(self.encoding.space.make(choices, stage), candidate.engine)
                for stage in range(arch.exit_stage)]

    def _add_earlier_exits(self, record: Record) -> None:
        for stage, candidate in enumerate(self._earlier_exits(record.candidate)):
            if candidate.key in self.archive:
                continue
            earlier = candidate.arch
            accuracy = ArchAccuracy(earlier.arch_id, stage, record.accuracy.accuracy_per_exit[: stage + 1])
            self._add(Record(record.order, record.generation, candidate, self.cost_model.costs(earlier), accuracy,
                             derived_from=record.candidate.arch.arch_id))

    # -- NearbyInit / NearbyMutate ----------------------------------------------------------
    #
    # Windows sit just under each budget, [b (1 - window), b]: AdaptiveNet observes that the
    # best variant for a budget is usually near it, and with several budgets in one run a
    # point just above one budget is already counted under the next. Mutation steers only
    # what left the band [smallest budget (1 - window), loosest budget] of a metric, so the
    # evolution inside the band is left alone.

    def _distance(self, value: float, target: float) -> float:
        lo, hi = target * (1 - self.options.window), target
        return 0.0 if lo <= value <= hi else (value - hi if value > hi else lo - value) / target

    def steer(self, x: np.ndarray, metric: str, target: float, rng: np.random.Generator) -> np.ndarray:
        """Move ``x`` one branch at a time until ``metric`` lies in the target's window.

        Each step tries every other value of every gene and keeps, among the moves that
        land in the window (else those that get closest), the smallest change: the
        neighbouring option of a block (w75 -> w50, not w75 -> k1) before a far one, a
        block before the exit. Ties are broken at random.
        """
        x = x.copy()
        dist = self._distance(self.price(x)[1].metric(metric), target)
        exit_gene = self.encoding.exit_gene
        for _ in range(2 * self.encoding.n_var):
            if dist == 0.0:
                break
            best: tuple[float, float, float] | None = None
            best_x = x
            for g in range(self.encoding.n_var):
                for value in range(int(self.encoding.upper[g]) + 1):
                    if value == x[g]:
                        continue
                    y = x.copy()
                    y[g] = value
                    d = self._distance(self.price(y)[1].metric(metric), target)
                    change = abs(value - int(x[g])) + (self.encoding.n_var if g == exit_gene else 0)
                    key = (d, float(change), float(rng.random()))
                    if best is None or key < best:
                        best, best_x = key, y
            if best is None or best[0] >= dist:
                break
            dist, x = best[0], best_x
        return x

    def _band_miss(self, x: np.ndarray) -> tuple[str, float] | None:
        """The budget to steer to when a metric left its band, else ``None``."""
        _, costs = self.price(x)
        for metric in self.budgets.metrics:
            values = getattr(self.budgets, metric)
            value = costs.metric(metric)
            if value > max(values) or value < min(values) * (1 - self.options.window):
                return metric, min(values, key=lambda b: abs(value - b))
        return None

    def nearby_init(self, n: int, rng: np.random.Generator) -> np.ndarray:
        X = self.encoding.random(rng, n)
        # The greedy path's steps first (at most half the population), the rest as before.
        seeded = min(len(self.seeds), n // 2)
        for i in range(seeded):
            X[i] = self.seeds[len(self.seeds) - seeded + i]  # the cheapest steps: the path's far end
        if not self.targets:
            return X
        for i in range(seeded, n):
            if rng.random() < self.options.coverage_share:
                continue
            metric, target = self.targets[i % len(self.targets)]
            X[i] = self.steer(X[i], metric, target, rng)
        return X

    def active_genes(self, x: np.ndarray) -> list[int]:
        """Genes that change the decoded candidate: executed positions, exit, engine."""
        candidate = self.encoding.decode(x)
        genes = [i for i, c in enumerate(candidate.arch.choices) if c != "-"]
        genes.append(self.encoding.exit_gene)
        if self.encoding.upper[self.encoding.engine_gene] > 0:
            genes.append(self.encoding.engine_gene)
        return genes

    def nearby_mutate(self, genes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        X = self.encoding.clip(genes).reshape(len(genes), self.encoding.n_var)
        upper = self.encoding.upper
        for i in range(len(X)):
            active = self.active_genes(X[i])
            g = active[int(rng.integers(len(active)))]
            if upper[g] > 0:
                others = [v for v in range(int(upper[g]) + 1) if v != X[i, g]]
                X[i, g] = others[int(rng.integers(len(others)))]
            if rng.random() < self.options.noise_prob:
                X[i] = self.encoding.clip(X[i] + rng.normal(0.0, self.options.noise_sigma, size=len(upper)))
            target = self._band_miss(X[i]) if self.targets else None
            if target is not None and rng.random() >= self.options.coverage_share:
                X[i] = self.steer(X[i], target[0], target[1], rng)
        return X


def _pymoo_parts(search: _Search) -> dict[str, Any]:
    from pymoo.core.duplicate import DuplicateElimination
    from pymoo.core.mutation import Mutation
    from pymoo.core.problem import Problem
    from pymoo.core.sampling import Sampling

    enc = search.encoding
    n_constr = len(search.limits)

    class SearchProblem(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=enc.n_var, n_obj=len(search.options.objectives), n_ieq_constr=n_constr,
                             xl=np.zeros(enc.n_var), xu=enc.upper.astype(float), vtype=int)

        def _evaluate(self, x: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            F, G = search.evaluate_genes(x)
            out["F"] = F
            if G is not None:
                out["G"] = G

    class NearbyInit(Sampling):
        def _do(self, problem: Any, n_samples: int, *args: Any, random_state: Any = None, **kwargs: Any) -> Any:
            return search.nearby_init(n_samples, random_state)

    class NearbyMutate(Mutation):
        def _do(self, problem: Any, x: Any, *args: Any, random_state: Any = None, **kwargs: Any) -> Any:
            return search.nearby_mutate(x, random_state)

    class SameCandidate(DuplicateElimination):
        """Duplicates by decoded candidate (many genotypes decode to one variant), and
        against the archive, so offspring slots go to variants not yet evaluated."""

        def _do(self, pop: Any, other: Any, is_duplicate: np.ndarray) -> np.ndarray:
            seen = set(search.archive) if other is not None else set()
            if other is not None:
                seen.update(enc.decode(x).key for x in other.get("X"))
            for i, x in enumerate(pop.get("X")):
                key = enc.decode(x).key
                if key in seen:
                    is_duplicate[i] = True
                else:
                    seen.add(key)
            return is_duplicate

    return {"problem": SearchProblem(), "init": NearbyInit(), "mutate": NearbyMutate(), "dedup": SameCandidate()}


def _run_nsga2(search: _Search, nearby: bool) -> str:
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.mating import Mating
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.operators.selection.tournament import TournamentSelection

    parts = _pymoo_parts(search)
    crossover = SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair())
    mutation = parts["mutate"] if nearby else PM(eta=20, vtype=float, repair=RoundingRepair())
    from pymoo.algorithms.moo.nsga2 import binary_tournament

    mating = Mating(TournamentSelection(func_comp=binary_tournament), crossover, mutation,
                    eliminate_duplicates=parts["dedup"], n_max_iterations=10)
    algorithm = NSGA2(pop_size=search.options.population,
                      sampling=parts["init"] if nearby else IntegerRandomSampling(),
                      mating=mating, eliminate_duplicates=parts["dedup"])
    algorithm.setup(parts["problem"], termination=("n_gen", 10**9), seed=search.options.seed, verbose=False)
    stall = 0
    while search.remaining > 0:
        before = search.evaluations
        algorithm.next()
        search.generation += 1
        if algorithm.termination.has_terminated():
            return "mating produced no new candidates"
        stall = stall + 1 if search.evaluations == before else 0
        if stall >= search.options.max_stall_generations:
            return f"no new feasible candidate in {stall} generations"
    return "evaluation budget reached"


def _run_random(search: _Search) -> str:
    rng = np.random.default_rng(search.options.seed)
    draws, max_draws = 0, 1000 * search.options.evaluations
    stall = 0
    while search.remaining > 0:
        before = search.evaluations
        X = search.encoding.random(rng, search.options.population)
        draws += len(X)
        search.evaluate_genes(X)
        search.generation += 1
        stall = stall + 1 if search.evaluations == before else 0
        if draws >= max_draws or stall >= 10 * search.options.max_stall_generations:
            return f"no new feasible candidate after {draws} random draws"
    return "evaluation budget reached"


def _run_listed(search: _Search) -> str:
    """Evaluate the listed variants (after the largest, which greedy_walk put first), once each."""
    space = search.encoding.space
    genes = [search.encoding.encode(search.encoding.candidate(space.parse(a))) for a in search.options.candidates]
    search.evaluate_genes(np.stack(genes))
    search.generation += 1
    return f"the {len(search.options.candidates)} listed variant(s) evaluated"


def run_search(encoding: Encoding, costs: VariantCostModel, evaluator: PrefixEvaluator, budgets: BudgetSweep,
               options: SearchOptions, *, progress: ProgressCallback = no_progress) -> SearchResult:
    """Search, returning the archive of evaluated variants and its front."""
    options.validate()
    for name in options.objectives:
        if name != "accuracy" and name not in COST_METRICS:
            raise UsageError(f"unknown objective {name!r}")
    start = time.perf_counter()
    if options.method == "auto" or (options.method == "listed" and not options.candidates):
        raise UsageError(f"method {options.method!r} needs its candidates resolved first "
                         "(hmt.pareto.candidates.resolve_search)")
    if options.method == "listed":  # every listed variant is evaluated, whatever the evaluation budget says
        options = replace(options, evaluations=len(options.candidates) + 1, greedy_share=0.0)
    search = _Search(encoding, costs, evaluator, budgets, options, progress)
    search.greedy_walk()
    if options.method == "listed":
        reason = _run_listed(search)
    else:
        reason = _run_random(search) if options.method == "random" else _run_nsga2(search, options.method == "nearby")
    front = front_of(search.records, options.objectives)
    extras: dict[str, Any] = {}
    if search.closest is not None:
        extras["closest_infeasible"] = search.closest[1:]
    return SearchResult(search.records, front, search.priced, search.infeasible, search.generation,
                        time.perf_counter() - start, evaluator.stats, reason, options, budgets, extras)


def front_of(records: Sequence[Record], objectives: Sequence[str]) -> list[int]:
    """Indices of the non-dominated records over ``objectives`` (accuracy maximised)."""
    if not records:
        return []
    F = np.array([[r.objective(o) for o in objectives] for r in records])
    return [int(i) for i in front_indices(F)]


def minimise_metric(encoding: Encoding, costs: VariantCostModel, metric: str) -> tuple[Candidate, Costs]:
    """The variant of least ``metric`` found by coordinate descent from the space's
    smallest variant (a cheap check that a budget can be met at all)."""
    x = encoding.encode(encoding.candidate(encoding.space.smallest()))
    best = costs.costs(encoding.decode(x).arch).metric(metric)
    improved = True
    while improved:
        improved = False
        for g in range(encoding.n_var):
            for value in range(int(encoding.upper[g]) + 1):
                y = x.copy()
                y[g] = value
                v = costs.costs(encoding.decode(y).arch).metric(metric)
                if v < best:
                    x, best, improved = y, v, True
    candidate = encoding.decode(x)
    return candidate, costs.costs(candidate.arch)
