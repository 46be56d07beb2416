"""Benchmark the pareto stage: search quality and cost, prefix reuse, index lookups.

Three parts, each writing one JSON file under benchmarks/pareto/:

- ``search``: NSGA-II + NearbyInit/NearbyMutate + noise ("nearby") against plain NSGA-II
  ("evolution") and random search at the same evaluation budget, over several seeds:
  hypervolume (accuracy x latency within the loosest budget, and all four objectives
  normalised over every run), best accuracy under each of 3 latency budgets,
  evaluations needed to reach random search's final best under each budget, and the
  search's own overhead. Accuracies come from one shared, memoised evaluator (a
  variant's accuracy is deterministic, so each run's trajectory is exactly that of an
  independent run); wall time of independent runs is what ``reuse`` measures.
- ``reuse``: the variants one nearby search evaluated, generation by generation, through
  (a) the prefix evaluator with its feature cache, (b) without the cache, (c) each alone
  (materialise + BN re-estimation + evaluation): block evaluations and wall time, and a
  check that all three give identical accuracies.
- ``index``: best-within-budgets lookups at 10^2, 10^3, 10^4 entries (1, 2 and 3 budgets),
  p50/p90 over 20,000 random queries, against a numpy scan.

Torch runs one thread (on the shared 2-core machine two spinning OpenMP threads made a
ResNet forward up to ~50x slower). Usage::

    python -m benchmarks.pareto.search search --supernet runs/pareto/r20 --profile profiles/jetson-nano.json \\
        --evaluations 120 --seeds 0 1 2 --max-eval-samples 500 --out benchmarks/pareto/search_r20.json
    python -m benchmarks.pareto.search reuse --supernet runs/pareto/r20 --profile profiles/jetson-nano.json \\
        --max-eval-samples 500 --out benchmarks/pareto/reuse_r20.json
    python -m benchmarks.pareto.search index --out benchmarks/pareto/index_lookup.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Driver

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def machine() -> dict[str, Any]:
    from hmt.profile.parsers import parse_cpuinfo

    try:
        model = str(parse_cpuinfo(Path("/proc/cpuinfo").read_text()).get("model", ""))
    except OSError:
        model = ""
    return {"platform": platform.platform(), "cpu": model, "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": list(os.getloadavg()), "torch_threads": 1}


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


# --------------------------------------------------------------------------- set-up


def setup(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from hmt.pareto.data import calibration_batches, device_batches, held_out_data
    from hmt.pareto.encoding import Encoding
    from hmt.pareto.objectives import ProfilePredictor, VariantCostModel, measure_block_costs
    from hmt.profile import load_profile
    from hmt.supernet import load_supernet

    loaded = load_supernet(args.supernet, device=args.device)
    # Costs are shapes and counts: traced on a CPU copy, whatever device evaluates accuracy.
    cost_net = load_supernet(args.supernet).net if args.device != "cpu" else loaded.net
    blocks = measure_block_costs(cost_net)
    profile = load_profile(args.profile)
    costs = VariantCostModel(cost_net, blocks, ProfilePredictor(profile, blocks, loaded.space))
    encoding = Encoding(loaded.space, choice_order=costs.choice_order(loaded.space))
    data = held_out_data(loaded, data_path=args.data, split=args.data_split, max_samples=args.max_eval_samples, seed=0)
    batches = device_batches(data, batch_size=args.batch_size, device=args.device)
    calibration = calibration_batches(loaded, device=args.device, max_samples=args.calibration_samples)
    rng = np.random.default_rng(12345)
    latencies = np.array([costs.costs(encoding.decode(x).arch).latency_ms for x in encoding.random(rng, 4000)])
    if args.latency_budgets:
        budgets = sorted(float(v) for v in args.latency_budgets)
    else:  # the 20th, 40th and 60th percentiles of uniformly random variants
        budgets = [float(np.quantile(latencies, q)) for q in (0.2, 0.4, 0.6)]
    return {"loaded": loaded, "costs": costs, "encoding": encoding, "data": data, "batches": batches,
            "calibration": calibration, "latency_budgets_ms": budgets, "profile": profile,
            "random_latency_ms": {"min": float(latencies.min()), "median": float(np.median(latencies)),
                                  "max": float(latencies.max())}}


def describe_setup(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    space = env["loaded"].space
    manifest = env["loaded"].artifact.manifest
    return {
        "supernet": {"path": str(args.supernet), "space_tag": space.tag, "positions": len(space.positions),
                     "space_size": space.size(), "largest_val_acc": manifest.metrics.get("largest_val_acc"),
                     "smallest_val_acc": manifest.metrics.get("smallest_val_acc"),
                     "train_config": {k: manifest.config.get(k) for k in (
                         "backbone", "pretrained", "data_path", "max_train_samples", "backbone_epochs",
                         "distill_epochs", "finetune_epochs")}},
        "profile": {"path": str(args.profile), "name": env["profile"].name},
        "held_out": env["data"].describe(),
        "calibration_samples": sum(len(b) for b in env["calibration"]) if env["calibration"] else 0,
        "latency_budgets_ms": env["latency_budgets_ms"],
        "random_variant_latency_ms": env["random_latency_ms"],
    }


# --------------------------------------------------------------------------- search


def run_search_bench(args: argparse.Namespace) -> dict[str, Any]:

    from hmt.pareto.budgets import BudgetSweep
    from hmt.pareto.evaluate import PrefixEvaluator
    from hmt.pareto.front import hypervolume
    from hmt.pareto.search import SearchOptions, front_of, run_search

    env = setup(args)
    budgets = BudgetSweep.of(latency_ms=env["latency_budgets_ms"])
    oracle = PrefixEvaluator(env["loaded"].net, env["batches"], calibration=env["calibration"],
                             cache_bytes=int(args.cache_mb * 1e6))
    runs: list[dict[str, Any]] = []
    for seed in args.seeds:
        for method in args.methods:
            # "nearby-cover": the nearby search with --coverage-share of its candidates left unsteered.
            options = SearchOptions(method="nearby" if method == "nearby-cover" else method,
                                    evaluations=args.evaluations, population=args.population, seed=seed,
                                    coverage_share=args.coverage_share if method == "nearby-cover" else 0.0)
            before = oracle.stats.wall_s
            started = time.perf_counter()
            result = run_search(env["encoding"], env["costs"], oracle, budgets, options)
            wall = time.perf_counter() - started
            evaluation_s = oracle.stats.wall_s - before
            records = [{"order": r.order, "derived": r.derived_from is not None,
                        "arch_id": r.candidate.arch.arch_id, "accuracy": r.accuracy.accuracy,
                        "latency_ms": r.costs.latency_ms, "energy": r.costs.energy, "memory_mb": r.costs.memory_mb}
                       for r in result.records]
            runs.append({"method": method, "seed": seed, "evaluations": result.evaluations,
                         "archive": len(result.records),
                         "generations": result.generations, "priced": result.priced,
                         "stop_reason": result.stop_reason, "wall_s": wall,
                         "search_overhead_s": wall - evaluation_s, "records": records,
                         "front": front_of(result.records, options.objectives)})
            print(f"{method} seed {seed}: {result.evaluations} evaluations, best "
                  f"{max(r['accuracy'] for r in records):.3f}, {wall:.0f} s", file=sys.stderr, flush=True)
    # Normalisation of the four objectives over every run's points.
    every = [r for run in runs for r in run["records"]]
    cols = ("latency_ms", "energy", "memory_mb")
    lo = {c: min(r[c] for r in every) for c in cols}
    hi = {c: max(r[c] for r in every) for c in cols}
    loosest = max(env["latency_budgets_ms"])
    band_lo = min(env["latency_budgets_ms"]) * 0.9
    for run in runs:
        recs = run["records"]
        pts2 = [[-r["accuracy"], r["latency_ms"]] for r in recs]
        run["hv_acc_latency"] = hypervolume(pts2, [0.0, loosest])
        # = the integral over budgets T in [band_lo, loosest] of the best accuracy within T,
        # divided by the band's width: the mean best accuracy over the budgets searched for.
        clipped = [[-r["accuracy"], max(r["latency_ms"], band_lo)] for r in recs]
        run["mean_best_accuracy_in_band"] = hypervolume(clipped, [0.0, loosest]) / (loosest - band_lo)
        pts4 = [[-r["accuracy"], *((r[c] - lo[c]) / ((hi[c] - lo[c]) or 1.0) for c in cols)] for r in recs]
        run["hv_4d_normalised"] = hypervolume(pts4, [0.0, 1.1, 1.1, 1.1])
        run["best_accuracy"] = {}
        for budget in env["latency_budgets_ms"]:
            within = [r["accuracy"] for r in recs if r["latency_ms"] <= budget]
            run["best_accuracy"][f"{budget:.4g}"] = max(within) if within else None
    # Evaluations to reach random search's (median) final best under each budget.
    targets: dict[str, float | None] = {}
    for budget in env["latency_budgets_ms"]:
        key = f"{budget:.4g}"
        targets[key] = median([run["best_accuracy"][key] for run in runs if run["method"] == "random"])
        for run in runs:
            target = targets[key]
            run.setdefault("evals_to_random_best", {})[key] = None
            if target is None:
                continue
            best = -1.0
            for r in run["records"]:
                if r["latency_ms"] <= budget:
                    best = max(best, r["accuracy"])
                if best >= target - 1e-12:
                    run["evals_to_random_best"][key] = r["order"] + 1
                    break
    summary: dict[str, Any] = {}
    for method in args.methods:
        mine = [run for run in runs if run["method"] == method]
        summary[method] = {
            "hv_acc_latency_median": median([r["hv_acc_latency"] for r in mine]),
            "mean_best_accuracy_in_band_median": median([r["mean_best_accuracy_in_band"] for r in mine]),
            "hv_4d_normalised_median": median([r["hv_4d_normalised"] for r in mine]),
            "best_accuracy_median": {k: median([r["best_accuracy"][k] for r in mine]) for k in targets},
            "evals_to_random_best_median": {
                k: median([r["evals_to_random_best"][k] if r["evals_to_random_best"][k] is not None
                           else float(args.evaluations + 1) for r in mine]) for k in targets},
            "runs_reaching_random_best": {k: sum(r["evals_to_random_best"][k] is not None for r in mine)
                                          for k in targets},
            "search_overhead_s_median": median([r["search_overhead_s"] for r in mine]),
            "priced_median": median([r["priced"] for r in mine]),
        }
    for run in runs:
        run.pop("records")
    return {"setup": describe_setup(args, env), "evaluations_budget": args.evaluations,
            "band_ms": [band_lo, loosest],
            "population": args.population, "seeds": list(args.seeds), "random_best_targets": targets,
            "summary": summary, "runs": runs, "oracle": oracle.stats.to_json_dict(),
            "normalisation": {"lo": lo, "hi": hi}}


# --------------------------------------------------------------------------- reuse


def run_reuse_bench(args: argparse.Namespace) -> dict[str, Any]:
    from hmt.pareto.budgets import BudgetSweep
    from hmt.pareto.evaluate import PrefixEvaluator, evaluate_plain
    from hmt.pareto.search import SearchOptions, run_search

    env = setup(args)
    net, batches, calibration = env["loaded"].net, env["batches"], env["calibration"]
    budgets = BudgetSweep.of(latency_ms=env["latency_budgets_ms"])
    # The groups one nearby search hands over (accuracies from a throw-away evaluator).
    probe = PrefixEvaluator(net, batches[:1], calibration=calibration[:1] if calibration else None)
    result = run_search(env["encoding"], env["costs"], probe, budgets,
                        SearchOptions(evaluations=args.evaluations, population=args.population, seed=0))
    groups: dict[int, list[Any]] = {}
    for r in result.records:
        if r.derived_from is None:  # earlier exits are free in a search: not part of the groups
            groups.setdefault(r.generation, []).append(r.candidate.arch)
    ordered = [groups[g] for g in sorted(groups)]
    out: dict[str, Any] = {"setup": describe_setup(args, env), "groups": [len(g) for g in ordered]}
    accuracies: dict[str, list[tuple[float, ...]]] = {}
    for name, cache_mb in (("prefix+cache", args.cache_mb), ("prefix, no cache", 0.0)):
        evaluator = PrefixEvaluator(net, batches, calibration=calibration, cache_bytes=int(cache_mb * 1e6))
        started = time.perf_counter()
        accs = [a.accuracy_per_exit for group in ordered for a in evaluator.evaluate(group)]
        out[name] = evaluator.stats.to_json_dict() | {"wall_s": time.perf_counter() - started,
                                                       "cache_mb": cache_mb}
        accuracies[name] = accs
        print(name, out[name], file=sys.stderr, flush=True)
    started = time.perf_counter()
    plain, stats = evaluate_plain(net, [a for group in ordered for a in group], batches, calibration=calibration)
    out["plain"] = stats.to_json_dict() | {"wall_s": time.perf_counter() - started}
    accuracies["plain"] = [a.accuracy_per_exit for a in plain]
    out["identical_accuracies"] = accuracies["plain"] == accuracies["prefix+cache"] == accuracies["prefix, no cache"]
    out["speedup_vs_plain"] = {k: out["plain"]["wall_s"] / out[k]["wall_s"] for k in ("prefix+cache",
                                                                                     "prefix, no cache")}
    return out


# --------------------------------------------------------------------------- index


def synthetic_entries(n: int, seed: int) -> list[Any]:
    """A front-like cloud: costs correlated (latency ~ energy ~ memory), accuracy rising
    with cost, plus noise: the shape a real front has, at any size."""
    import numpy as np

    from hmt.pareto.index import IndexEntry

    rng = np.random.default_rng(seed)
    size = rng.random(n)
    latency = 0.2 + 20 * size * rng.uniform(0.8, 1.2, n)
    energy = 1e6 * latency * rng.uniform(0.7, 1.3, n)
    memory = 0.05 + 10 * size ** 1.5 * rng.uniform(0.6, 1.4, n)
    accuracy = np.clip(0.5 + 0.4 * np.sqrt(size) + rng.normal(0, 0.03, n), 0, 1)
    return [IndexEntry(f"v{i}", float(accuracy[i]), float(latency[i]), float(energy[i]), float(memory[i]), 0,
                       (float(accuracy[i]),)) for i in range(n)]


def run_index_bench(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from hmt.pareto.index import FrontIndex

    out: dict[str, Any] = {"queries": args.queries, "sizes": {}}
    for n in (100, 1000, 10000):
        entries = synthetic_entries(n, seed=n)
        started = time.perf_counter()
        index = FrontIndex(entries)
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        index.prepare()
        prepare_s = time.perf_counter() - started
        rng = np.random.default_rng(0)
        lat = np.array([e.latency_ms for e in index.entries])
        en = np.array([e.energy for e in index.entries])
        mem = np.array([e.memory_mb for e in index.entries])
        acc_rank = np.arange(n)
        row: dict[str, Any] = {"build_s": build_s, "prepare_pair_trees_s": prepare_s}
        for kind in ("latency", "latency+memory", "latency+memory+energy"):
            qs = [(float(rng.uniform(lat.min(), lat.max())), float(rng.uniform(mem.min(), mem.max())),
                   float(rng.uniform(en.min(), en.max()))) for _ in range(args.queries)]
            times, scan_times = [], []
            for q_lat, q_mem, q_en in qs:
                kw: dict[str, float] = {"latency_ms": q_lat}
                if "memory" in kind:
                    kw["memory_mb"] = q_mem
                if "energy" in kind:
                    kw["energy"] = q_en
                t0 = time.perf_counter_ns()
                got = index.best_within_rank(**kw)
                times.append(time.perf_counter_ns() - t0)
                t0 = time.perf_counter_ns()
                ok = lat <= q_lat
                if "memory" in kind:
                    ok &= mem <= q_mem
                if "energy" in kind:
                    ok &= en <= q_en
                hits = acc_rank[ok]
                scan = int(hits[0]) if hits.size else None
                scan_times.append(time.perf_counter_ns() - t0)
                assert got == scan, (n, kind, got, scan)
            row[kind] = {"p50_us": float(np.percentile(times, 50)) / 1e3,
                         "p90_us": float(np.percentile(times, 90)) / 1e3,
                         "numpy_scan_p50_us": float(np.percentile(scan_times, 50)) / 1e3}
        out["sizes"][str(n)] = row
        print(n, row, file=sys.stderr, flush=True)
    return out


def _claims(report: dict[str, Any]) -> list[dict[str, str]]:
    """Index lookups (index part): p50 against a numpy scan at the largest size."""
    sizes = report.get("sizes")
    if not sizes:
        return []
    n = max(sizes, key=int)
    row = sizes[n]
    return [{"claim": f"front index lookup p50 against a numpy scan, {int(n):,} entries, "
                      f"{kind.count('+') + 1} budget(s)",
             "figure": f"{row[kind]['p50_us']:.2f} us against {row[kind]['numpy_scan_p50_us']:.2f} us"}
            for kind in ("latency", "latency+memory+energy") if kind in row]


BENCH = Driver(baseline="plain NSGA-II and random search at the same evaluation budget (search); a numpy scan (index)",
               quick=["index", "--queries", "2000", "--out", "{report}"],
               default=["index", "--out", "{report}"], needs="", claims=_claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    for name in ("search", "reuse"):
        p = sub.add_parser(name)
        p.add_argument("--supernet", type=Path, required=True)
        p.add_argument("--profile", type=Path, required=True)
        p.add_argument("--evaluations", type=int, default=120)
        p.add_argument("--population", type=int, default=24)
        p.add_argument("--max-eval-samples", type=int, default=500)
        p.add_argument("--calibration-samples", type=int, default=None,
                       help="use only the first N stored calibration samples (default: all)")
        p.add_argument("--batch-size", type=int, default=250)
        p.add_argument("--cache-mb", type=float, default=512.0)
        p.add_argument("--latency-budgets", type=float, nargs="*", default=None)
        p.add_argument("--device", default="cpu", help="where accuracy is evaluated (cpu, cuda)")
        p.add_argument("--data", type=Path, default=None, help="held-out data (default: the supernet's val split)")
        p.add_argument("--data-split", default="test", help="which part of --data")
        p.add_argument("--coverage-share", type=float, default=0.25, help="for method nearby-cover")
        p.add_argument("--out", type=Path, required=True)
        if name == "search":
            p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
            p.add_argument("--methods", nargs="+", default=["nearby", "evolution", "random"])
    p = sub.add_parser("index")
    p.add_argument("--queries", type=int, default=20000)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.time()
    at_start = machine()
    result = {"search": run_search_bench, "reuse": run_reuse_bench, "index": run_index_bench}[args.part](args)
    result["machine"] = at_start
    result["command"] = "python " + " ".join(sys.argv)
    result["total_wall_s"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
