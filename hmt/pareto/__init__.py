"""pareto: the accuracy / latency / energy / memory front of a supernet on one device.

The tree reads as the method: ``encoding`` (decision variables), ``objectives`` (costs
from a device profile), ``evaluate`` (accuracy with prefix reuse), ``search`` (NSGA-II
with NearbyInit / NearbyMutate and noise), ``front`` (dominance, hypervolume), ``index``
(the runtime index serve loads), ``plot``, ``artifact``, and ``run`` (the pipeline).

Importing this package, ``hmt.pareto.index`` or ``hmt.pareto.front`` imports neither torch
nor pymoo: names that need them load lazily.
"""

from hmt.pareto.budgets import BudgetSweep
from hmt.pareto.front import dominates, front_indices, hypervolume, non_dominated_mask
from hmt.pareto.index import FrontIndex, IndexEntry, load_index

__all__ = [
    "BudgetSweep",
    "FrontIndex",
    "IndexEntry",
    "LoadedFront",
    "ParetoOptions",
    "ParetoRun",
    "SearchOptions",
    "dominates",
    "find_front",
    "front_indices",
    "hypervolume",
    "load_front",
    "load_index",
    "non_dominated_mask",
]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    if name in ("find_front", "ParetoOptions", "ParetoRun"):
        from hmt.pareto import run

        return getattr(run, name)
    if name == "SearchOptions":
        from hmt.pareto.records import SearchOptions

        return SearchOptions
    if name in ("load_front", "LoadedFront"):
        from hmt.pareto import artifact

        return getattr(artifact, name)
    raise AttributeError(name)
