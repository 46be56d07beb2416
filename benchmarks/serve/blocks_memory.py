"""Resident memory when serving N variants: shared block graphs (serve --blocks) against whole variants.

Two families of N variants: the bundle's own (fastest first; ``whole`` and ``blocks`` below),
and the bundle's fastest plus N-1 variants near it, as re-search tries them (seeded mutations of
one or two blocks or the exit; ``nearby-blocks`` composes them, ``nearby-whole`` runs each as one
ONNX graph made by chaining its units' graphs, a whole copy per variant).

For each N from 1 to the bundle's variant count and each mode, a fresh process loads the first N
variants (fastest first) into serve's pool, the way ``hmt serve`` preloads them (verified graphs,
real ONNX Runtime sessions, warm-up runs), answers one input with each, and reports its resident
set above what it held before the pool was built, the pool's own count of its bytes and the
ONNX Runtime sessions alive. ``whole`` is :class:`~hmt.serve.running.pool.VariantPool` (each
variant's own graphs, fuse's layout), ``blocks`` is :class:`~hmt.serve.running.blocks.BlockPool`
(the variants composed from ``blocks/``, each block once). Repetitions interleave the modes;
the report gives medians.

What a variant costs on top of those already served is the slope of resident memory over N
(least squares over the nearby family's N >= 2, per mode), beside the slope of the weights the
pool counts and of the ONNX Runtime sessions alive. Why the bundle's own variants show little:
the pool's count of their bytes, blocks against whole, says how much of their weights they share
(Pareto variants spread along the front share few blocks), and every unit graph is one more
session, whose fixed cost is of the order of a small block's weights.

    PYTHONPATH=$PWD python -m benchmarks.serve blocks_memory --bundle runs/demo/bundle-blocks --reps 3

The bundle comes from ``hmt deploy --blocks`` (its variants run both ways).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver, child_env

MODES = ("whole", "blocks")
NEARBY_MODES = ("nearby-whole", "nearby-blocks")


def nearby_configs(bundle: Any, space: Any, n: int) -> list[Any]:
    """The bundle's fastest variant and n-1 variants re-search would try near it (seeded mutations)."""
    from hmt.runtime.blocks import BlockStore
    from hmt.serve.deciding.research import Research, ResearchSettings

    start = space.parse(min(bundle.spec.variants, key=lambda v: v.latency_ms).arch_id)
    research = Research(space, BlockStore(bundle, space), (np.zeros((1, *bundle.spec.input.shape[1:]), np.float32),
                                                            np.zeros(1, np.int64)), ResearchSettings(seed=0))
    configs = {start.arch_id: start}
    while len(configs) < n:
        mutated = research.mutate(start)
        if mutated is not None:
            configs.setdefault(mutated.arch_id, mutated)
    return list(configs.values())


def merged_whole(bundle: Any, space: Any, config: Any) -> bytes:
    """``config`` as ONE ONNX graph (its units chained, the last exit head): a whole-variant copy."""
    import onnx
    from onnx import compose

    from hmt.runtime.verified import read_verified

    units, _, exits = space.units_of(config)
    chain = [u for u in [*units, exits[config.exit_stage]] if not space.units[u].identity]
    merged = None
    for k, unit in enumerate(chain):
        model = compose.add_prefix(onnx.load_from_string(read_verified(bundle.artifact, space.units[unit].onnx)),
                                   f"u{k}_")
        merged = model if merged is None else compose.merge_models(
            merged, model, io_map=[(merged.graph.output[0].name, model.graph.input[0].name)])
    assert merged is not None
    return bytes(merged.SerializeToString())


def measure(bundle_path: Path, mode: str, n: int) -> dict[str, Any]:
    import gc

    import onnxruntime
    import psutil

    from hmt.bundle import load_bundle
    from hmt.runtime.variant import example_input
    from hmt.serve.running.blocks import BlockPool
    from hmt.serve.running.pool import VariantPool

    proc = psutil.Process()
    bundle = load_bundle(bundle_path)
    ids = [v.arch_id for v in sorted(bundle.spec.variants, key=lambda v: v.latency_ms)][:n]
    x = example_input(bundle, np.random.default_rng(0))
    if mode in NEARBY_MODES:
        return measure_nearby(bundle, mode, n, x)
    gc.collect()
    before = proc.memory_info().rss
    pool: Any = (BlockPool(bundle, threads=1, warmup_runs=3) if mode == "blocks" else
                 VariantPool(bundle, engine="onnxruntime", threads=1, warmup_runs=3, early_exit=True))
    for arch_id in ids:
        pool.load(arch_id).run(x, None)
    gc.collect()
    after = proc.memory_info().rss
    sessions = sum(isinstance(o, onnxruntime.InferenceSession) for o in gc.get_objects())
    return {"mode": mode, "variants": n, "rss_mb_added": (after - before) / 2**20, "pool_mb": pool.loaded_bytes() / 1e6,
            "ort_sessions": sessions}


def measure_nearby(bundle: Any, mode: str, n: int, x: np.ndarray) -> dict[str, Any]:
    """N variants near the fastest (what re-search adds): composed from blocks, or one whole graph each."""
    import gc

    import onnxruntime
    import psutil

    from hmt.runtime.blocks import BlockStore, compose, load_block_space
    from hmt.runtime.ort import ort_session
    from hmt.runtime.variant import SERVE_DEFAULT_ORT

    space = load_block_space(bundle)
    configs = nearby_configs(bundle, space, n)
    graphs = [merged_whole(bundle, space, c) for c in configs] if mode == "nearby-whole" else []
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    held: list[Any] = []
    pool_bytes = 0
    if mode == "nearby-blocks":
        store = BlockStore(bundle, space)
        for config in configs:
            runner = compose(store, config)
            runner.run(x, None)
            held.append(runner)
        pool_bytes = store.loaded_bytes()
    else:
        for graph in graphs:
            fn = ort_session(graph, SERVE_DEFAULT_ORT).graph_fn()
            fn(x)
            held.append(fn)
            pool_bytes += len(graph)
    gc.collect()
    after = proc.memory_info().rss
    sessions = sum(isinstance(o, onnxruntime.InferenceSession) for o in gc.get_objects())
    return {"mode": mode, "variants": n, "rss_mb_added": (after - before) / 2**20, "pool_mb": pool_bytes / 1e6,
            "ort_sessions": sessions}


def run(bundle: Path, reps: int, nearby: int) -> dict[str, Any]:
    from hmt.bundle import load_bundle

    count = len(load_bundle(bundle).spec.variants)
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    cases = [(mode, n) for n in range(1, count + 1) for mode in MODES]
    cases += [(mode, n) for n in nearby_counts(nearby) for mode in NEARBY_MODES]
    for _ in range(reps):
        for mode, n in cases:
            done = subprocess.run([sys.executable, "-m", "benchmarks.serve.blocks_memory", "--bundle", str(bundle),
                                   "--one", mode, str(n)], capture_output=True, text=True, env=child_env(),
                                  check=True, timeout=600)
            rows.setdefault((mode, n), []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    table = []
    for (mode, n), runs in sorted(rows.items(), key=lambda item: (item[0][1], item[0][0])):
        table.append({"mode": mode, "variants": n, "repetitions": len(runs),
                      "rss_mb_added_median": float(np.median([r["rss_mb_added"] for r in runs])),
                      "rss_mb_added_all": [round(r["rss_mb_added"], 2) for r in runs],
                      "pool_mb": runs[0]["pool_mb"], "ort_sessions": runs[0]["ort_sessions"]})
    return {"bundle_variants": count, "nearby_variants": nearby, "table": table,
            "shared": shared_weights(bundle), "marginal": marginal(table)}


def nearby_counts(nearby: int) -> list[int]:
    """N of the nearby family: 1, 2, 4, ... up to ``nearby``."""
    counts, n = [], 1
    while n < nearby:
        counts.append(n)
        n *= 2
    return [*counts, nearby]


def shared_weights(bundle_path: Path) -> dict[str, Any]:
    """Of the bundle's variants: the bytes of the units each runs, summed per variant, against the
    distinct units among them (what blocks load once), and the units used by more than one."""
    from hmt.bundle import load_bundle
    from hmt.runtime.blocks import load_block_space

    bundle = load_bundle(bundle_path)
    space = load_block_space(bundle)
    used: list[set[Any]] = []
    for variant in bundle.spec.variants:
        units, _, exits = space.units_of(space.parse(variant.arch_id))
        used.append({u for u in [*units, *exits.values()] if not space.units[u].identity})
    distinct = set().union(*used)
    shared = {u for u in distinct if sum(u in s for s in used) > 1}
    return {"per_variant_sum_mb": sum(space.units[u].size_bytes for s in used for u in s) / 1e6,
            "distinct_mb": sum(space.units[u].size_bytes for u in distinct) / 1e6,
            "units_distinct": len(distinct), "units_shared": len(shared),
            "shared_mb": sum(space.units[u].size_bytes for u in shared) / 1e6}


def marginal(table: list[dict[str, Any]]) -> dict[str, Any]:
    """Per nearby mode: least-squares slopes over N >= 2 of resident MB, weights MB and sessions per
    added variant; and the fixed cost of one more session, from N = 1 (blocks: many sessions, whole:
    one) after the weights are taken out."""
    out: dict[str, Any] = {}
    for mode in NEARBY_MODES:
        rows = sorted((r for r in table if r["mode"] == mode and r["variants"] >= 2), key=lambda r: r["variants"])
        if len(rows) < 2:
            continue
        n = np.array([r["variants"] for r in rows], dtype=float)

        def slope(key: str, rows: list[dict[str, Any]] = rows, n: np.ndarray = n) -> float:
            return float(np.polyfit(n, np.array([r[key] for r in rows], dtype=float), 1)[0])

        out[mode] = {"rss_mb_per_variant": slope("rss_mb_added_median"), "weights_mb_per_variant": slope("pool_mb"),
                     "sessions_per_variant": slope("ort_sessions"), "n": [int(v) for v in n]}
    one = {r["mode"]: r for r in table if r["variants"] == 1 and r["mode"] in NEARBY_MODES}
    if len(one) == 2:
        b, w = one["nearby-blocks"], one["nearby-whole"]
        extra = b["ort_sessions"] - w["ort_sessions"]
        if extra > 0:
            out["session_mb"] = ((b["rss_mb_added_median"] - w["rss_mb_added_median"])
                                 - (b["pool_mb"] - w["pool_mb"])) / extra
    return out


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    return report


def claims(report: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    by = {(r["mode"], r["variants"]): r for r in report["table"]}
    n = report["bundle_variants"]
    for k in sorted({1, n}):
        whole, blocks = by[("whole", k)], by[("blocks", k)]
        out.append({"claim": f"resident memory added serving {k} variant(s), blocks vs whole variants "
                             f"(median of {whole['repetitions']} fresh processes)",
                    "figure": f"{blocks['rss_mb_added_median']:.1f} MB vs {whole['rss_mb_added_median']:.1f} MB "
                              f"(pool's own count {blocks['pool_mb']:.2f} vs {whole['pool_mb']:.2f} MB)"})
    shared = report.get("shared")
    if shared:
        out.append({"claim": f"why the bundle's {n} variants save little: the weights of the units each runs, "
                             "summed per variant, against the distinct units among them (units shared by two or "
                             "more)",
                    "figure": f"{shared['per_variant_sum_mb']:.2f} MB vs {shared['distinct_mb']:.2f} MB "
                              f"({shared['units_shared']} of {shared['units_distinct']} units, "
                              f"{shared['shared_mb']:.2f} MB)"})
    m = report.get("marginal") or {}
    if "nearby-blocks" in m and "nearby-whole" in m:
        b, w = m["nearby-blocks"], m["nearby-whole"]
        out.append({"claim": "per added nearby variant (slope over N = "
                             f"{', '.join(str(v) for v in b['n'])}): resident memory, blocks vs one whole graph each",
                    "figure": f"{b['rss_mb_per_variant']:.3f} MB vs {w['rss_mb_per_variant']:.3f} MB"})
        out.append({"claim": "per added nearby variant: weights the pool counts / ONNX Runtime sessions, blocks vs "
                             "whole",
                    "figure": f"{b['weights_mb_per_variant']:.3f} vs {w['weights_mb_per_variant']:.3f} MB / "
                              f"{b['sessions_per_variant']:.1f} vs {w['sessions_per_variant']:.1f}"})
    if "session_mb" in m:
        out.append({"claim": "resident cost of one more ONNX Runtime session beyond its weights (N = 1: the "
                             "composed variant's unit sessions against one whole graph)",
                    "figure": f"{m['session_mb']:.3f} MB"})
    k = report.get("nearby_variants")
    if k and ("nearby-blocks", k) in by:
        whole, blocks = by[("nearby-whole", k)], by[("nearby-blocks", k)]
        out.append({"claim": f"resident memory added serving the fastest variant and {k - 1} variants near it "
                             "(re-search's mutations), blocks vs one whole graph each",
                    "figure": f"{blocks['rss_mb_added_median']:.1f} MB vs {whole['rss_mb_added_median']:.1f} MB "
                              f"(weights {blocks['pool_mb']:.2f} vs {whole['pool_mb']:.2f} MB)"})
    return out


BENCH = Driver(
    baseline="the same N variants served as whole variants (VariantPool) in fresh processes of the same run",
    needs="a bundle from hmt deploy --blocks (--bundle)",
    summarise=summarise,
    claims=claims,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="a bundle from hmt deploy --blocks")
    parser.add_argument("--reps", type=int, default=3, help="fresh processes per (mode, N)")
    parser.add_argument("--nearby", type=int, default=32,
                        help="also: the fastest variant and up to this many-1 variants near it (re-search's)")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="write the report here (JSON)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.bundle, args.one[0], int(args.one[1]))))
        return
    report = run(args.bundle, args.reps, args.nearby)
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
