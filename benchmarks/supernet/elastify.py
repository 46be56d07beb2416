"""Benchmark elastification (issue 12): torchvision models on CIFAR-10, end to end.

For each model: train the original on the data when no weights are given (timed apart),
elastify it (graph analysis + exits + branch-wise distillation + fine-tuning: the
"elastification time"), write and reload the supernet artifact (checksums verified), then

- the original's test accuracy and the largest variant's (they must be equal; a difference
  is flagged in the JSON and on stderr), with the max abs error between them before and
  after training;
- every variant of the artifact's table (largest, smallest, ``--variants`` random ones)
  exported to ONNX and timed with ONNX Runtime on the CPU, batch 1, ``--ort-threads``
  threads, round-robin over ``--rounds`` rounds in a seeded shuffled order (median of each
  round's median), the original timed the same way in the same rounds;
- the front of accuracy against that latency, and the fastest variant whose validation
  accuracy is within ``--within`` points of the original's, with its test accuracy and
  its speedup over the original;
- the greedy shrinking path (``hmt.pareto.greedy``): from the largest variant, one block at a
  time, the change that loses the least validation accuracy per MAC saved (chosen on
  ``--greedy-samples`` validation images, at most ``--greedy-evaluations`` variants, until
  ``--greedy-drop`` points are lost); its variants are timed and reported like the others
  (role "greedy"), since random variants rarely land near the original's accuracy.

One JSON per model in ``--out``; a markdown summary on stdout. CPU smoke test (embedded
CIFAR-10 subset, tiny sizes)::

    PYTHONPATH=$PWD python -m benchmarks.supernet.elastify --models resnet18 --max-train-samples 96 \\
        --original-epochs 1 --exit-epochs 1 --distill-epochs 1 --finetune-epochs 1 --variants 3 \\
        --rounds 2 --reps 3 --device cpu --out runs/bench-elastify

GPU run (see benchmarks/README.md, "Elastify"): ``--data CIFAR10_JPEG --device cuda``.
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

import numpy as np

from benchmarks.harness import Driver

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _export(module: Any, input_shape: tuple[int, ...], what: str) -> Any:
    import torch

    from hmt.convert.export import export_module

    module = module.cpu().float().eval()
    model, _ = export_module(module, [torch.zeros(1, *input_shape)], input_names=["x"], output_names=["logits"],
                             exporter="torchscript", what=what)
    return model


def time_sessions(sessions: dict[str, Any], input_shape: tuple[int, ...], *, rounds: int, reps: int,
                  seed: int) -> dict[str, dict[str, float]]:
    """Round-robin: each round visits every session once in a shuffled order and takes the
    median of ``reps`` runs; the latency is the median over rounds (and its spread)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, *input_shape)).astype(np.float32)
    for session in sessions.values():
        for _ in range(3):
            session.run(None, {"x": x})  # warm-up: allocations, thread pool
    per_round: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for _ in range(rounds):
        for i in rng.permutation(len(names)):
            name = names[int(i)]
            runs = []
            for _ in range(reps):
                start = time.perf_counter()
                sessions[name].run(None, {"x": x})
                runs.append((time.perf_counter() - start) * 1e3)
            per_round[name].append(statistics.median(runs))
    return {name: {"latency_ms": statistics.median(v), "latency_ms_min": min(v), "latency_ms_max": max(v)}
            for name, v in per_round.items()}


def pareto_front(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Rows no other row beats on both latency (lower) and ``key`` accuracy (higher)."""
    front, best = [], -1.0
    for row in sorted(rows, key=lambda r: (r["latency_ms"], -r[key])):
        if row[key] > best:
            front.append(row)
            best = row[key]
    return front


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from hmt.supernet import load_supernet
    from hmt.supernet.elastify.train import elastify_supernet
    from hmt.supernet.train import resolve_config

    out_dir = (args.artifact_dir or args.out) / name
    weights = args.weights_dir / f"{name}.safetensors" if args.weights_dir else None
    overrides: dict[str, Any] = {
        "dataset": "cifar10",
        "data_path": str(args.data) if args.data else None,
        "device": args.device,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "backbone_epochs": args.original_epochs,
        "backbone_lr": args.original_lr,
        "partition_epochs": args.exit_epochs,
        "distill_epochs": args.distill_epochs,
        "finetune_epochs": args.finetune_epochs,
        "finetune_lr": args.finetune_lr,
        "eval_variants": args.variants,
        "max_train_samples": args.max_train_samples,
        "calibration_samples": args.calibration_samples,
        "extra": {"elastify": {"torchvision": name, "input_shape": [1, 3, 32, 32],
                               "weights": str(weights) if weights else None},
                  "train_original": weights is None},
    }
    config = resolve_config(overrides=overrides)
    started = time.perf_counter()
    if args.reuse and (out_dir / "supernet" / "manifest.json").is_file():
        # A supernet this script trained before (e.g. in an earlier call on the same machine):
        # its metrics and variant table come from the verified artifact.
        import pandas as pd

        from hmt.supernet.artifact import VARIANTS

        earlier = load_supernet(out_dir / "supernet")
        m = dict(earlier.artifact.manifest.metrics)
        table = pd.read_csv(earlier.artifact.file(VARIANTS))
        print(f"{name}: reusing {out_dir / 'supernet'} (trained earlier)", file=sys.stderr)
    else:
        result = elastify_supernet(config, out_dir / "supernet", cache_dir=args.cache_dir,
                                   progress=_progress if args.progress else _quiet)
        assert result is not None  # one process: it is rank 0
        m, table = result.metrics, result.variants
    wall_s = time.perf_counter() - started
    if m["largest_test_acc"] != m["original_test_acc"]:
        print(f"WARNING {name}: largest variant test acc {m['largest_test_acc']} != original "
              f"{m['original_test_acc']}", file=sys.stderr)
    loaded = load_supernet(out_dir / "supernet")
    history = json.loads((out_dir / "supernet" / "history.json").read_text())
    original_train_s = sum(h.get("epoch_s", 0.0) for h in history if h.get("phase") == "original")
    from hmt.supernet.elastify.source import ModelSpec, build_model

    spec = ModelSpec(input_shape=(1, 3, 32, 32), torchvision=name, num_classes=10)
    original = build_model(spec)
    original.load_state_dict(_original_state(loaded))
    input_shape = tuple(loaded.space.input_shape)
    sessions = {"original": _session(_export(original, input_shape, f"{name} original"), args.ort_threads)}
    rows: list[dict[str, Any]] = []
    for r in table.itertuples():
        variant = loaded.materialize(str(r.arch_id))
        sessions[str(r.arch_id)] = _session(_export(variant, input_shape, str(r.arch_id)), args.ort_threads)
        rows.append({"arch_id": str(r.arch_id), "role": str(r.role), "exit_stage": int(r.exit_stage),
                     "val_acc": float(r.val_acc), "test_acc": float(r.test_acc), "params": int(r.params),
                     "macs": int(r.macs)})
    greedy_s = 0.0
    if args.greedy_evaluations > 0:
        greedy_started = time.perf_counter()
        known = {row["arch_id"] for row in rows}
        for row in greedy_rows(loaded, args):
            if row["arch_id"] not in known:
                variant = loaded.materialize(row["arch_id"])
                sessions[row["arch_id"]] = _session(_export(variant, input_shape, row["arch_id"]), args.ort_threads)
                rows.append(row)
        greedy_s = time.perf_counter() - greedy_started
    timing = time_sessions(sessions, input_shape, rounds=args.rounds, reps=args.reps, seed=args.seed)
    for row in rows:
        row.update(timing[row["arch_id"]])
    original_ms = timing["original"]["latency_ms"]
    largest = next(r for r in rows if r["role"] == "largest")
    eligible = [r for r in rows if r["val_acc"] >= largest["val_acc"] - args.within / 100]
    best = min(eligible, key=lambda r: r["latency_ms"])
    return {
        "model": name,
        "original_test_acc": m["original_test_acc"],
        "largest_test_acc": m["largest_test_acc"],
        "largest_val_acc": largest["val_acc"],
        "largest_equals_original": m["largest_test_acc"] == m["original_test_acc"],
        "max_abs_error_before_training": m["largest_vs_original_max_abs_before"],
        "max_abs_error_after_training": m["largest_vs_original_max_abs_after"],
        "original_latency_ms": original_ms,
        "original_timing": timing["original"],
        "largest_latency_ms": largest["latency_ms"],
        "best_within": {"points": args.within, **best, "speedup": original_ms / best["latency_ms"]},
        "front_val": pareto_front(rows, "val_acc"),
        "front_test": pareto_front(rows, "test_acc"),
        "variants": rows,
        "original_trained_here": m["original_trained_here"],
        "original_train_s": original_train_s,
        "analysis_s": m["analysis_s"],
        "elastic_train_s": m["elastic_train_s"],
        "elastify_s": m["elastify_s"],
        "wall_s": wall_s,
        "greedy_search_s": greedy_s,
        "blocks": m["blocks"],
        "blocks_kept_unchanged": m["blocks_kept_unchanged"],
        "space_size": m["space_size"],
        "train_device": m["device"],
        "artifact": str(out_dir / "supernet"),
        "config": config.to_json_dict(),
    }


def greedy_rows(loaded: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The greedy shrinking path from the largest variant (hmt.pareto.greedy): accuracy on a
    stratified subset of the supernet's validation split, cost = MACs; then the test accuracy
    of every variant on the path, BN-calibrated on the stored set as the variant table is."""
    import copy

    import torch

    from hmt.pareto.data import calibration_batches, device_batches, held_out_data
    from hmt.pareto.evaluate import PrefixEvaluator
    from hmt.pareto.greedy import greedy_path
    from hmt.supernet.metrics import measure_cost

    device = "cuda" if args.device in ("cuda", "auto") and torch.cuda.is_available() else "cpu"
    net = loaded.net.to(device).eval()
    calibration = calibration_batches(loaded, device=device)

    def evaluator(data: Any) -> PrefixEvaluator:
        return PrefixEvaluator(net, device_batches(data, batch_size=500, device=device), calibration=calibration)

    search_eval = evaluator(held_out_data(loaded, max_samples=args.greedy_samples, seed=args.seed,
                                          cache_dir=args.cache_dir))
    val_eval = evaluator(held_out_data(loaded, cache_dir=args.cache_dir))
    test_eval = evaluator(held_out_data(loaded, data_path=args.data, split="test", cache_dir=args.cache_dir))
    cpu_net = copy.deepcopy(net).cpu().float()
    input_shape = tuple(loaded.space.input_shape)
    costs: dict[str, Any] = {}

    def cost(arch: Any) -> float:
        if arch.arch_id not in costs:
            costs[arch.arch_id] = measure_cost(cpu_net.materialize(arch).eval(), input_shape)
        return float(costs[arch.arch_id].macs)

    path = greedy_path(loaded.space, lambda archs: [a.accuracy for a in search_eval.evaluate(archs)], cost,
                       max_drop=args.greedy_drop / 100, max_evaluations=args.greedy_evaluations)
    archs = [step.arch for step in path]
    vals, tests = val_eval.evaluate(archs), test_eval.evaluate(archs)
    loaded.net.cpu()  # the variants are exported from the CPU copy next
    print(f"greedy path: {len(path)} variants, {path[-1].evaluations} evaluated", file=sys.stderr)
    return [{"arch_id": step.arch.arch_id, "role": "greedy", "exit_stage": step.arch.exit_stage,
             "val_acc": v.accuracy, "test_acc": t.accuracy, "search_acc": step.accuracy,
             "params": int(costs[step.arch.arch_id].params), "macs": int(costs[step.arch.arch_id].macs),
             "greedy_step": i}
            for i, (step, v, t) in enumerate(zip(path, vals, tests, strict=True))]


def _original_state(loaded: Any) -> dict[str, Any]:
    """The user's model's weights, rebuilt from the supernet's original path (the largest
    variant is exact, so this is the original; it is checked again by its accuracy)."""
    import torch

    from hmt.supernet.elastify.source import ModelSpec, build_model

    spec = ModelSpec(input_shape=(1, *loaded.space.input_shape), torchvision=loaded.space.backbone,
                     num_classes=loaded.space.num_classes)
    fresh = build_model(spec)
    net = loaded.net
    own: dict[str, torch.Tensor] = {}
    for module in net.original_modules():
        for key, value in module.state_dict().items():
            own[key] = value
    state = fresh.state_dict()
    missing = [k for k in state if k not in own and not k.endswith("num_batches_tracked")]
    if missing:
        raise SystemExit(f"cannot rebuild the original's weights: missing {missing[:3]}")
    return {k: own.get(k, v) for k, v in state.items()}


def _progress(task: str, done: int, total: int | None, info: str | None = "") -> None:
    if done == total or done % 50 == 0:
        print(f"  {task} {done}/{total} {info}", file=sys.stderr, flush=True)


def _quiet(task: str, done: int, total: int | None, info: str | None = "") -> None:
    return None


def summary(results: list[dict[str, Any]], host: dict[str, Any]) -> str:
    lines = [f"host: {host['cpu']} ({host['cores']} cores), train device: {results[0]['train_device']}, "
             f"ORT threads {host['ort_threads']}, batch 1", "",
             "| model | original acc | largest acc | max abs err (before/after) | original ms | best within "
             f"{results[0]['best_within']['points']:g} pts (val) | its test acc | its ms | speedup | "
             "elastify s (analysis + train) | original train s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        b = r["best_within"]
        lines.append(
            f"| {r['model']} | {100 * r['original_test_acc']:.2f} | {100 * r['largest_test_acc']:.2f} | "
            f"{r['max_abs_error_before_training']:.1e} / {r['max_abs_error_after_training']:.1e} | "
            f"{r['original_latency_ms']:.3f} | `{b['arch_id']}` | {100 * b['test_acc']:.2f} | "
            f"{b['latency_ms']:.3f} | {b['speedup']:.2f}x | {r['elastify_s']:.0f} ({r['analysis_s']:.0f} + "
            f"{r['elastic_train_s']:.0f}) | {r['original_train_s']:.0f} |")
    for r in results:
        lines += ["", f"{r['model']} front (test acc vs ORT CPU ms):",
                  ", ".join(f"{1e0 * f['latency_ms']:.3f} ms {100 * f['test_acc']:.1f}%" for f in r["front_test"])]
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


BENCH = Driver(
    baseline="the original network: its test accuracy and its ONNX Runtime latency in the same rounds",
    needs="CIFAR-10 (--data) and, for the figures, a GPU (--device cuda)",
    report="{tmp}/out",
    out_args=("--out", "{tmp}/out"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mobilenet_v2,resnet18")
    parser.add_argument("--data", type=Path, default=None, help="CIFAR-10 location (default: embedded subset)")
    parser.add_argument("--weights-dir", type=Path, default=None, help="NAME.safetensors per model; else trained")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--original-epochs", type=int, default=20)
    parser.add_argument("--original-lr", type=float, default=0.1)
    parser.add_argument("--exit-epochs", type=int, default=1)
    parser.add_argument("--distill-epochs", type=int, default=3)
    parser.add_argument("--finetune-epochs", type=int, default=6)
    parser.add_argument("--finetune-lr", type=float, default=0.02)
    parser.add_argument("--variants", type=int, default=30, help="random variants timed (plus largest, smallest)")
    parser.add_argument("--max-train-samples", type=int, default=None)
    parser.add_argument("--calibration-samples", type=int, default=2048)
    parser.add_argument("--ort-threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--within", type=float, default=2.0, help="accuracy points below the original")
    parser.add_argument("--greedy-evaluations", type=int, default=400,
                        help="variants the greedy shrinking path may evaluate (0: no path)")
    parser.add_argument("--greedy-drop", type=float, default=4.0, help="accuracy points the path may lose")
    parser.add_argument("--greedy-samples", type=int, default=2500, help="validation images the path is chosen on")
    parser.add_argument("--reuse", action="store_true", help="reuse a supernet this script wrote to --artifact-dir")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-elastify"), help="the JSON results")
    parser.add_argument("--artifact-dir", type=Path, default=None, help="supernet artifacts (default: --out)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="decoded-dataset cache (default ~/.cache/hmt)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    host = {"cpu": _cpu_name(), "cores": os.cpu_count(), "ort_threads": args.ort_threads,
            "python": platform.python_version()}
    results = []
    for name in [n.strip() for n in args.models.split(",") if n.strip()]:
        result = bench_model(name, args)
        result["host"] = host
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True))
        results.append(result)
    print(summary(results, host))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
