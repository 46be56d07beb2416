"""Encoding, NearbyInit / NearbyMutate, reproducibility, and the stage end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hmt.errors import ArtifactError, BudgetError, InputError, UsageError
from hmt.pareto import BudgetSweep, FrontIndex, ParetoOptions, SearchOptions, find_front, load_front, load_index
from hmt.pareto.encoding import Encoding
from hmt.pareto.evaluate import PrefixEvaluator
from hmt.pareto.objectives import ProfilePredictor, VariantCostModel
from hmt.pareto.search import _Search, run_search
from hmt.profile import load_profile
from hmt.progress import no_progress

from .conftest import NANO, block_table_profile


@pytest.fixture(scope="module")
def parts(tiny_loaded, tiny_blocks):  # type: ignore[no-untyped-def]
    model = VariantCostModel(tiny_loaded.net, tiny_blocks,
                             ProfilePredictor(load_profile(NANO), tiny_blocks, tiny_loaded.space))
    encoding = Encoding(tiny_loaded.space, choice_order=model.choice_order(tiny_loaded.space))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))]
    return tiny_loaded, model, encoding, batches


def test_encoding_round_trip(parts) -> None:  # type: ignore[no-untyped-def]
    loaded, _, encoding, _ = parts
    rng = np.random.default_rng(0)
    for x in encoding.random(rng, 50):
        candidate = encoding.decode(x)
        assert encoding.decode(encoding.encode(candidate)) == candidate
    assert encoding.n_var == len(loaded.space.positions) + 2
    with pytest.raises(UsageError, match="expected"):
        encoding.decode([0, 1])
    with pytest.raises(UsageError, match="not a permutation"):
        Encoding(loaded.space, choice_order={loaded.space.positions[0].name: ["base"]})


def test_nearby_init_and_mutate_stay_near_the_budget(parts) -> None:  # type: ignore[no-untyped-def]
    _, model, encoding, batches = parts
    latencies = sorted(model.costs(encoding.decode(x).arch).latency_ms
                       for x in encoding.random(np.random.default_rng(1), 200))
    budget = float(np.median(latencies))
    search = _Search(encoding, model, PrefixEvaluator(model.net, batches), BudgetSweep.of(latency_ms=[budget]),
                     SearchOptions(window=0.1, coverage_share=0.0).validate(), no_progress)
    rng = np.random.default_rng(0)
    X = search.nearby_init(40, rng)
    near = [abs(model.costs(encoding.decode(x).arch).latency_ms / budget - 1) <= 0.1 + 1e-9 for x in X]
    random_near = np.mean([abs(v / budget - 1) <= 0.1 for v in latencies])
    assert np.mean(near) >= 0.9 > random_near
    Y = search.nearby_mutate(X.copy(), rng)
    assert np.mean([abs(model.costs(encoding.decode(y).arch).latency_ms / budget - 1) <= 0.1 + 1e-9
                    for y in Y]) >= 0.9
    assert any(encoding.decode(x) != encoding.decode(y) for x, y in zip(X, Y, strict=True))
    # With a coverage share, that share of the candidates is left where it lands.
    covering = _Search(encoding, model, PrefixEvaluator(model.net, batches), BudgetSweep.of(latency_ms=[budget]),
                       SearchOptions(window=0.1, coverage_share=0.5).validate(), no_progress)
    Z = covering.nearby_init(200, np.random.default_rng(0))
    near_share = np.mean([abs(model.costs(encoding.decode(z).arch).latency_ms / budget - 1) <= 0.1 + 1e-9 for z in Z])
    assert 0.4 < near_share < 0.75


@pytest.mark.parametrize("method", ["nearby", "evolution", "random"])
def test_search_is_reproducible_and_respects_budgets(parts, method: str) -> None:  # type: ignore[no-untyped-def]
    _, model, encoding, batches = parts
    budgets = BudgetSweep.of(latency_ms=[0.7, 0.9])
    options = SearchOptions(method=method, evaluations=12, population=6, seed=3)

    def run() -> list[tuple[str, float]]:
        result = run_search(encoding, model, PrefixEvaluator(model.net, batches), budgets, options)
        assert result.evaluations <= 12 and model.net is not None
        assert all(r.costs.latency_ms <= 0.9 for r in result.records)
        assert result.front and all(0 <= i < len(result.records) for i in result.front)
        return [(r.candidate.key, r.accuracy.accuracy) for r in result.records]

    assert run() == run()


def test_options_are_validated() -> None:
    with pytest.raises(UsageError, match="unknown search method"):
        SearchOptions(method="annealing").validate()
    with pytest.raises(UsageError, match="objectives"):
        SearchOptions(objectives=("latency_ms",)).validate()
    with pytest.raises(UsageError, match="positive"):
        BudgetSweep.of(latency_ms=[0.0])
    budgets = BudgetSweep.of(latency_ms=[2, 1], memory_mb=[3])
    assert budgets.limits() == {"latency_ms": 2.0, "memory_mb": 3.0}
    assert budgets.combos() == [{"latency_ms": 1.0, "memory_mb": 3.0}, {"latency_ms": 2.0, "memory_mb": 3.0}]
    assert BudgetSweep().combos() == [{}] and not BudgetSweep()


def test_find_front_end_to_end(tiny_supernet: Path, tmp_path: Path) -> None:
    out = tmp_path / "front"
    options = ParetoOptions(budgets=BudgetSweep.of(latency_ms=[0.45, 0.7], memory_mb=[0.5]),
                            search=SearchOptions(evaluations=16, population=8, seed=0), max_eval_samples=40)
    run = find_front(tiny_supernet, NANO, out, options)
    loaded = load_front(out)
    assert {f.path for f in loaded.artifact.manifest.files} == {"front.json", "index.json", "archive.csv",
                                                                "front.png"}
    assert loaded.artifact.manifest.parents[0].kind == "supernet"
    doc = loaded.doc
    assert doc["profile"]["name"] == "jetson-nano" and doc["profile"]["energy_unit"] == "mac_equivalent"
    assert doc["data"]["samples"] == 40
    assert len(doc["answers"]) == 2 and run.metrics["evaluations"] == 16
    for point in doc["points"]:
        assert point["latency_ms"] <= 0.7 and point["memory_mb"] <= 0.5
        assert len(point["accuracy_per_exit"]) == point["exit_stage"] + 1
        assert point["accuracy"] == point["accuracy_per_exit"][-1]
        assert point["predicted_for"] == "cortexA57-4c-cpu_onnxruntime-estimated"
    # The index serve loads agrees with the front and with the per-budget answers.
    index = load_index(out)
    assert isinstance(index, FrontIndex) and len(index) == len(doc["points"])
    for answer in doc["answers"]:
        best = index.best_within(**answer["budgets"])
        assert (best.arch_id if best else None) == answer["arch_id"]
        if answer["arch_id"] is None:
            assert answer["closest"] is not None
    import csv

    with open(out / "archive.csv") as handle:
        archive = list(csv.DictReader(handle))
    assert sum(not row["derived_from"] for row in archive) == 16
    for row in archive:  # an earlier exit of an evaluated variant, at no extra evaluation
        if row["derived_from"]:
            parent = next(r for r in archive if r["arch_id"] == row["derived_from"])
            assert int(row["exit_stage"]) < int(parent["exit_stage"]) and row["order"] == parent["order"]
    assert 0 < run.metrics["block_evals"] < run.metrics["block_evals_plain"]
    # Accuracies in the front equal each variant materialised, calibrated and evaluated alone.
    from hmt.pareto.data import calibration_batches, device_batches, held_out_data
    from hmt.pareto.evaluate import evaluate_plain
    from hmt.supernet import load_supernet

    loaded = load_supernet(tiny_supernet)
    batches = device_batches(held_out_data(loaded, max_samples=40, seed=0), batch_size=256)
    archs = [loaded.space.parse(p["arch_id"]) for p in doc["points"][:3]]
    plain, _ = evaluate_plain(loaded.net, archs, batches, calibration=calibration_batches(loaded))
    assert [list(r.accuracy_per_exit) for r in plain] == [p["accuracy_per_exit"] for p in doc["points"][:3]]


def test_budgets_nothing_meets(tiny_supernet: Path, tmp_path: Path) -> None:
    options = ParetoOptions(budgets=BudgetSweep.of(latency_ms=[0.01]),
                            search=SearchOptions(evaluations=4, population=4), max_eval_samples=16)
    with pytest.raises(BudgetError, match=r"least latency_ms.* is \d+(\.\d+)?% over 0.01"):
        find_front(tiny_supernet, NANO, tmp_path / "none", options)
    assert not (tmp_path / "none").exists()


def test_budgets_met_alone_but_not_together(tiny_supernet: Path, tiny_loaded, tiny_blocks,  # type: ignore[no-untyped-def]
                                            tmp_path: Path) -> None:
    """Made-up block latencies decouple latency from memory; the closest miss is named."""
    shapes = {pair: block.input_shape for pair, block in tiny_blocks.items()}
    # The leanest block (skip) made the slowest: least memory and least latency part ways.
    profile = block_table_profile(tmp_path / "table.json", shapes, space_tag=tiny_loaded.space.tag,
                                  overrides={("s0.b0", "skip"): 5.0})
    model = VariantCostModel(tiny_loaded.net, tiny_blocks,
                             ProfilePredictor(load_profile(profile), tiny_blocks, tiny_loaded.space))
    encoding = Encoding(tiny_loaded.space)
    grids = np.stack(np.meshgrid(*[np.arange(u + 1) for u in encoding.upper], indexing="ij"), -1)
    costs = [model.costs(encoding.decode(x).arch) for x in grids.reshape(-1, encoding.n_var)]
    latency = min(c.latency_ms for c in costs) * 1.02
    m_fast = min(c.memory_mb for c in costs if c.latency_ms <= latency)
    m_all = min(c.memory_mb for c in costs)
    assert m_all < m_fast
    options = ParetoOptions(budgets=BudgetSweep.of(latency_ms=[latency], memory_mb=[(m_all + m_fast) / 2]),
                            search=SearchOptions(evaluations=4, population=4, max_stall_generations=2),
                            max_eval_samples=16)
    with pytest.raises(BudgetError, match=r"the closest is .*% over"):
        find_front(tiny_supernet, profile, tmp_path / "none", options)


def test_bad_inputs(tiny_supernet: Path, tmp_path: Path) -> None:
    options = ParetoOptions(search=SearchOptions(evaluations=2, population=2), max_eval_samples=8)
    with pytest.raises(InputError, match="does not exist"):
        find_front(tmp_path / "missing", NANO, tmp_path / "o", options)
    with pytest.raises(InputError, match="missing.json: does not exist"):
        find_front(tiny_supernet, tmp_path / "missing.json", tmp_path / "o", options)
    with pytest.raises(ArtifactError, match="kind is 'supernet'"):  # a supernet passed as the profile
        find_front(tiny_supernet, tiny_supernet, tmp_path / "o", options)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "hmt.device-profile"}))
    with pytest.raises(InputError, match="missing top-level field"):
        find_front(tiny_supernet, bad, tmp_path / "o", options)
    with pytest.raises(UsageError, match="uncalibrated energy"):
        find_front(tiny_supernet, NANO, tmp_path / "o", ParetoOptions(budgets=BudgetSweep.of(energy=[1.0])))
    with pytest.raises(InputError, match="does not exist"):
        find_front(tiny_supernet, NANO, tmp_path / "o",
                   ParetoOptions(data_path=tmp_path / "nowhere", search=SearchOptions(evaluations=2, population=2)))
    with pytest.raises(ArtifactError):
        load_front(tiny_supernet)


def test_greedy_share_walks_from_the_largest_and_seeds_the_search(parts) -> None:  # type: ignore[no-untyped-def]
    loaded, model, encoding, batches = parts
    options = SearchOptions(evaluations=30, population=8, greedy_share=0.5, greedy_drop=1.0).validate()
    search = _Search(encoding, model, PrefixEvaluator(model.net, batches), BudgetSweep(), options, no_progress)
    search.greedy_walk()
    largest = encoding.candidate(loaded.space.largest()).key
    assert largest in search.archive  # the path starts at the original
    assert len(search.seeds) >= 2 and search.evaluations <= 15  # its share of the budget, no more
    latencies = [model.costs(encoding.decode(x).arch).latency_ms for x in search.seeds]
    assert latencies == sorted(latencies, reverse=True) and len(set(latencies)) == len(latencies)
    X = search.nearby_init(8, np.random.default_rng(0))
    seeded = {encoding.decode(x).key for x in X[:min(4, len(search.seeds))]}
    assert seeded <= {encoding.decode(x).key for x in search.seeds}
    result = run_search(encoding, model, PrefixEvaluator(model.net, batches), BudgetSweep(), options)
    assert largest in {r.candidate.key for r in result.records}
    assert result.evaluations <= 30
    with pytest.raises(UsageError, match="greedy share"):
        SearchOptions(greedy_share=1.0).validate()
    # Without the path the largest variant (the user's model) is still evaluated, first.
    plain = run_search(encoding, model, PrefixEvaluator(model.net, batches), BudgetSweep(),
                       SearchOptions(evaluations=10, population=4).validate())
    assert plain.records[0].candidate.key == largest


def test_an_earlier_exit_of_another_candidate_of_the_group_enters_once(parts) -> None:  # type: ignore[no-untyped-def]
    """A group holding a variant and its own earlier exit: the exit comes free with the variant,
    once (evaluated as well, it stood twice on the archive and the front, and deploy refused
    the bundle's index)."""
    _, model, encoding, batches = parts
    search = _Search(encoding, model, PrefixEvaluator(model.net, batches), BudgetSweep(),
                     SearchOptions(evaluations=10).validate(), no_progress)
    space = encoding.space
    late = space.make([p.choices[-1] for p in space.positions])
    early = space.make(list(late.choices), 0)
    genes = np.stack([encoding.encode(encoding.candidate(a)) for a in (late, early)])
    search.evaluate_genes(genes)
    keys = [r.candidate.key for r in search.records]
    assert len(keys) == len(set(keys)) and search.evaluations == 1
    assert search.archive[encoding.candidate(early).key].derived_from == late.arch_id
