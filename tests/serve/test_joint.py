"""The joint decision (hmt.serve.deciding.joint): variant, precision, cut, codec and the adapted copy
under the latency, memory and energy budgets, from the estimates and the measured link."""

from __future__ import annotations

import math

import numpy as np

from hmt.runtime.settings import Budgets
from hmt.serve.deciding.costs import Variant
from hmt.serve.deciding.decision import DecisionPath
from hmt.serve.deciding.joint import CutRoute, JointPath, RouteConditions, VariantRoutes
from hmt.serve.deciding.optimizer import REASON_BEST, Optimizer

MB = 1_000_000
# big: accurate, slow, 40 MB; small: 4x faster, 10 MB; small_int8: the int8 copy of small.
TABLE = [Variant("big", 0.9, 20.0, 8.0, 40 * MB), Variant("small", 0.7, 5.0, 2.0, 10 * MB),
         Variant("small_int8", 0.68, 3.0, 1.5, 6 * MB)]


class Provider:
    """An offload device as the joint decision sees it: cut costs and the link now."""

    def __init__(self, rtt_ms: float | None = 1.0, ms_per_byte: float = 1e-5) -> None:
        self.version = 1
        self.conditions = RouteConditions(rtt_ms=rtt_ms, ms_per_byte=ms_per_byte)
        # big cut after 10% of its compute: 10 kB float32, 2.5 kB int8; the peer runs the tail in 2 ms.
        cuts = tuple(CutRoute(0, codec, 2.0, 0.1, 2.0, size) for codec, size in (("float32", 10_000),
                                                                                  ("int8", 2_500)))
        self.routes = {"big": VariantRoutes(20.0, cuts), "small": VariantRoutes(5.0, ()),
                       "small_int8": VariantRoutes(3.0, ())}

    def route_costs(self) -> tuple[int, dict[str, VariantRoutes]]:
        return self.version, self.routes

    def route_conditions(self) -> RouteConditions:
        return self.conditions


def _decide(path: JointPath, budgets: Budgets, *, mu: float = 1.0, adopted: str | None = None,
            latencies: list[float] | None = None) -> tuple[str, str, bool]:
    opt = path.optimizer
    lat = latencies if latencies is not None else [v.latency_ms for v in opt.variants]
    limit = math.inf if budgets.latency_ms is None else budgets.latency_ms
    mask = path.feasible(lat, [1.0] * len(lat), 0.0, limit, budgets, adopted)
    choice = path.choose(mask, mu, None)
    i = path.route_index(choice.arch_id)
    return choice.arch_id, path.candidates[i].label, choice.reason_code == REASON_BEST


def test_a_tight_latency_budget_offloads_the_accurate_variant_over_the_measured_link() -> None:
    path = JointPath(Optimizer(TABLE), Provider())
    # All local only small fits 8 ms; big cut at 0 costs ~2.1 + 1 + 0.1 + 2 ms: the accurate one, offloaded.
    arch, label, ok = _decide(path, Budgets(latency_ms=8.0))
    assert (arch, ok) == ("big", True) and "@cut0/" in label
    # The int8 codec sends a quarter of the bytes: on a slow link it is the one chosen.
    slow = JointPath(Optimizer(TABLE), Provider(ms_per_byte=1e-3))
    assert _decide(slow, Budgets(latency_ms=8.0))[1] == "big@cut0/int8"
    # Breaker open: no cut is a candidate; the fastest local variant that fits the budget.
    closed = JointPath(Optimizer(TABLE), Provider(rtt_ms=None))
    assert _decide(closed, Budgets(latency_ms=8.0))[:2] == ("small", "small@local")


def test_a_memory_budget_below_a_variants_footprint_keeps_every_route_of_it_out() -> None:
    path = JointPath(Optimizer(TABLE), Provider())
    assert _decide(path, Budgets(latency_ms=8.0))[0] == "big"
    # 30 MB < big's 40 MB: its offloaded routes would meet the latency budget, but the device holds
    # the whole variant (the fallback tail), so none of them is feasible.
    arch, label, ok = _decide(path, Budgets(latency_ms=8.0, memory_mb=30.0))
    assert (arch, label, ok) == ("small", "small@local", True)
    big = [i for i, c in enumerate(path.candidates) if c.arch_id == "big"]
    assert big and not any(path.feasible_bits >> i & 1 for i in big)
    # Below every variant: the least memory one, flagged infeasible.
    assert _decide(path, Budgets(memory_mb=5.0)) == ("small_int8", "small_int8@local", False)


def test_an_energy_budget_is_met_by_offloading_the_device_share() -> None:
    path = JointPath(Optimizer(TABLE), Provider())
    # big all local costs 8 (over 3); cut after 10% of its compute costs 0.8 on the device.
    arch, label, ok = _decide(path, Budgets(energy=3.0))
    assert arch == "big" and "@cut0/" in label and ok
    i = path.route_index("big")
    assert path.energy[i] <= 3.0 < TABLE[0].energy_mj
    # With the peer gone the energy budget leaves only the small variants (small: 2.0 <= 3).
    closed = JointPath(Optimizer(TABLE), Provider(rtt_ms=None))
    assert _decide(closed, Budgets(energy=3.0))[:2] == ("small", "small@local")


def test_precision_is_a_gene_and_measured_estimates_move_the_choice() -> None:
    precisions = {"big": "fp32", "small": "fp32", "small_int8": "int8"}
    path = JointPath(Optimizer(TABLE), None, precisions=precisions)
    assert _decide(path, Budgets(latency_ms=6.0))[0] == "small"
    # small measured at 7 ms now (the estimates, measured first): its int8 copy is the one that fits.
    lat = [{"big": 20.0, "small": 7.0, "small_int8": 3.0}[v.arch_id] for v in path.optimizer.variants]
    arch, _, ok = _decide(path, Budgets(latency_ms=6.0), latencies=lat)
    assert (arch, ok) == ("small_int8", True)
    assert path.candidates[path.route_index(arch)].precision == "int8"


def test_the_adapted_copy_is_a_candidate_only_when_adopted_and_within_memory() -> None:
    # The peer out of reach (the adapted copy is device-only either way): big cannot meet 6 ms.
    path = JointPath(Optimizer(TABLE), Provider(rtt_ms=None), adapt_bytes={"small": 4 * MB})
    budgets = Budgets(latency_ms=6.0)
    assert _decide(path, budgets)[1] == "small@local"  # nothing adopted yet
    assert _decide(path, budgets, adopted="small")[1] == "small@local+adapted"
    # 12 MB holds small (10) but not small and its adapted copy (14): the shipped one runs.
    assert _decide(path, Budgets(latency_ms=6.0, memory_mb=12.0), adopted="small")[1] == "small@local"


def test_with_local_routes_only_it_chooses_as_the_local_loop() -> None:
    rng = np.random.default_rng(0)
    optimizer = Optimizer(TABLE)
    joint = JointPath(optimizer, None)
    local = DecisionPath(optimizer)
    n = len(optimizer.variants)
    for _ in range(300):
        lat = [float(v) for v in rng.uniform(1.0, 30.0, n)]
        budgets = Budgets(latency_ms=float(rng.uniform(2.0, 25.0)), memory_mb=float(rng.choice([5.0, 12.0, 50.0])),
                          energy=None if rng.random() < 0.5 else float(rng.uniform(1.0, 9.0)))
        mu = float(rng.choice([0.3, 0.7, 1.0]))
        mask = joint.feasible(lat, [1.0] * n, 0.0, budgets.latency_ms or math.inf, budgets)
        got = joint.choose(mask, mu, None)
        want = local.choose(local.feasible(lat, [1.0] * n, 0.0, budgets.latency_ms or math.inf, budgets), mu, None)
        assert (got.arch_id, got.reason_code) == (want.arch_id, want.reason_code), (lat, budgets, mu)


def test_choices_are_cached_on_the_feasible_set_and_costs_rebuild_on_a_new_version() -> None:
    provider = Provider()
    path = JointPath(Optimizer(TABLE), provider)
    for _ in range(5):
        _decide(path, Budgets(latency_ms=8.0))
    assert path.hits >= 4
    before = len(path.candidates)
    provider.routes = {**provider.routes, "small": VariantRoutes(5.0, (CutRoute(0, "float32", 1.0, 0.1, 1.0, 100),))}
    provider.version += 1
    _decide(path, Budgets(latency_ms=8.0))
    assert len(path.candidates) == before + 1


def test_nothing_feasible_a_bigger_local_variant_needs_newer_evidence_and_a_route_does_not() -> None:
    """Table order: small_int8, small, big. Nothing fits 1 ms. Locally, a bigger variant's lower
    estimate is the fallback only when measured at least as recently (as Optimizer.fallback); an
    offloaded route competes on its cost, which the link and the peer set, not the local samples."""
    closed = JointPath(Optimizer(TABLE), Provider(rtt_ms=None))
    lat = [30.0, 12.0, 50.0]  # small_int8's p95 now, small's from earlier, big's
    budgets = Budgets(latency_ms=1.0)
    bits, fallback, _ = closed.feasible(lat, [1.0] * 3, 0.0, 1.0, budgets, None, [10.0, 9.0, 9.0])
    assert bits == 0 and closed.candidates[fallback].label == "small_int8@local"
    _, fallback, _ = closed.feasible(lat, [1.0] * 3, 0.0, 1.0, budgets, None, [10.0, 10.0, 9.0])
    assert closed.candidates[fallback].label == "small@local"
    _, fallback, _ = closed.feasible(lat, [1.0] * 3, 0.0, 1.0, budgets)  # no times: the lowest cost
    assert closed.candidates[fallback].label == "small@local"
    # with the link up, big cut at 0 costs about 8 ms: the cheapest, whatever the local samples' age
    path = JointPath(Optimizer(TABLE), Provider())
    bits, fallback, _ = path.feasible(lat, [1.0] * 3, 0.0, 1.0, budgets, None, [10.0, 9.0, 1.0])
    assert bits == 0 and path.candidates[fallback].label.startswith("big@cut0/")
