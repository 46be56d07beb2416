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
    cases += [(mode, n) for n in sorted({1, 2, 4, nearby}) if n <= nearby for mode in NEARBY_MODES]
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
    return {"bundle_variants": count, "nearby_variants": nearby, "table": table}


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
    parser.add_argument("--nearby", type=int, default=8,
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
