"""``hmt pareto``: search a supernet's accuracy / latency / energy / memory front for one device."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from commands._options import DebugOpt, ForceOpt, JsonOpt, QuietOpt
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
**Examples**

The front for an estimated Jetson Nano, three latency budgets and a memory budget, accuracy
measured on the supernet's own validation split:

    hmt pareto --supernet runs/supernet --profile profiles/jetson-nano.json \\
        --latency-ms 0.5 --latency-ms 1 --latency-ms 2 --memory-mb 1 --out runs/pareto-nano

On the device's own ("edge") data, 500 images of it, 300 evaluations:

    hmt pareto --supernet runs/r18 --profile runs/profile --data ../shared/datasets/cifar10-jpeg \\
        --max-eval-samples 500 --evaluations 300 --latency-ms 20 --out runs/pareto-r18

Precision as a gene: INT8 copies of the fp32 front's variants, each quantised (ORT QDQ,
calibrated on the supernet's stored images), measured on the held-out data and timed against
fp32 here; one losing more than --max-accuracy-drop points is refused:

    hmt pareto --supernet runs/supernet --profile profiles/jetson-nano.json --precision int8 \
        --max-accuracy-drop 1 --out runs/pareto-int8

The baselines (same evaluation budget): --method evolution (plain NSGA-II) or --method random.

A specialized supernet (hmt specialize) trained only the variants its variants.csv lists: the
front is made of those and their earlier exits, without a search (--method auto resolves to
listed); --candidates FILE.csv evaluates any other list the same way:

    hmt pareto --supernet runs/specialized --profile runs/profile --out runs/pareto-specialized

Writes front.json (per point: arch id, config, accuracy per exit, predicted latency / energy /
memory, the profile they were predicted for), index.json (the runtime index serve loads),
archive.csv (every evaluated variant) and front.png. BudgetSweep that nothing meets fail with
exit code 8 and name the closest variant and by how much it misses.
"""


class MethodChoice(str, Enum):
    auto = "auto"
    nearby = "nearby"
    evolution = "evolution"
    random = "random"
    listed = "listed"


class SplitChoice(str, Enum):
    test = "test"
    train = "train"
    all = "all"


@app.command("pareto", epilog=_EPILOG)
def pareto_command(
    supernet: Annotated[Path, typer.Option("--supernet", help="Supernet artifact (hmt train-supernet).")],
    profile: Annotated[Path, typer.Option(
        "--profile", help="Device profile: a profile-device artifact or a profiles/*.json file.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")] = Path(
        "runs/pareto"),
    latency_ms: Annotated[list[float] | None, typer.Option(
        "--latency-ms", help="Latency budget in ms; repeat for several.")] = None,
    energy_mj: Annotated[list[float] | None, typer.Option(
        "--energy-mj", help="Energy budget in mJ per inference (needs a calibrated profile); repeatable.")] = None,
    memory_mb: Annotated[list[float] | None, typer.Option(
        "--memory-mb", help="Memory budget in MB (1e6 bytes: fp32 parameters + activation peak); repeatable.")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", help="Held-out (edge) data of the supernet's dataset kind; default: its validation split.")] = None,
    data_split: Annotated[SplitChoice, typer.Option(
        "--data-split", help="Which part of --data to evaluate on.")] = SplitChoice.test,
    max_eval_samples: Annotated[int | None, typer.Option(
        help="Evaluate on a seeded, stratified subset of this many samples.")] = None,
    method: Annotated[MethodChoice, typer.Option(
        help="auto: listed for a specialized supernet (hmt specialize), else nearby; nearby: NSGA-II + "
             "NearbyInit/NearbyMutate + noise; evolution: plain NSGA-II; random; listed: no search, the variants "
             "of --candidates (default: the supernet's variants.csv) and their earlier exits.")] = (
        MethodChoice.auto),
    candidates: Annotated[Path | None, typer.Option(
        "--candidates", help="A CSV with an arch_id column (a variants.csv or a front CSV): evaluate exactly "
        "these variants and their earlier exits (method listed).")] = None,
    evaluations: Annotated[int, typer.Option(help="Accuracy evaluations (distinct variants) to spend.")] = 200,
    population: Annotated[int, typer.Option(help="Population (and group) size.")] = 32,
    objectives: Annotated[str, typer.Option(
        help="Comma-separated objectives: accuracy plus any of latency_ms, energy, memory_mb.")] = (
        "accuracy,latency_ms,energy,memory_mb"),
    window: Annotated[float, typer.Option(
        help="NearbyInit/NearbyMutate window under each budget: [budget x (1 - window), budget].")] = 0.1,
    noise_prob: Annotated[float, typer.Option(help="Share of offspring given Gaussian gene noise.")] = 0.25,
    coverage_share: Annotated[float, typer.Option(
        help="Share of candidates not steered into a budget window: more of the front's fast end "
        "(0.25: +6.6% hypervolume, -1.3 points at the loosest budget; "
        "benchmarks/pareto/results/search_coverage_share.json).")] = 0.0,
    greedy_share: Annotated[float, typer.Option(
        help="Share of the evaluations spent first on a greedy shrinking path from the largest variant (one "
             "block at a time, least accuracy lost per ms saved), which then seeds the search: finds the "
             "variants within a point or two of the original that random starts miss. 0: off.")] = 0.0,
    greedy_drop: Annotated[float, typer.Option(
        help="Accuracy points the greedy path may lose against the largest variant.")] = 5.0,
    calibration_samples: Annotated[int | None, typer.Option(
        help="Re-estimate each variant's BN statistics on only the first N stored calibration samples.")] = None,
    batch_size: Annotated[int, typer.Option(help="Evaluation batch size.")] = 256,
    cache_mb: Annotated[float, typer.Option(help="Memory bound of the cross-generation feature cache.")] = 256.0,
    device: Annotated[str, typer.Option(help="Where accuracy is evaluated: cpu, cuda or cuda:N.")] = "cpu",
    threads: Annotated[int | None, typer.Option(
        help="Torch CPU threads while evaluating (1 is fastest on a busy shared machine).")] = None,
    no_block_table: Annotated[bool, typer.Option(
        "--no-block-table", help="Predict latency with eq. 2 even if the profile has a block table.")] = False,
    precision: Annotated[list[str] | None, typer.Option(
        "--precision", help="Extra precisions that compete on the front: int8 (CPUs), fp16 (needs ORT's CUDA "
        "provider); repeatable. fp32 is always searched.")] = None,
    max_accuracy_drop: Annotated[float, typer.Option(
        help="Refuse a quantised variant that loses more than this many points (0-100) against its fp32 copy "
             "on the held-out data.")] = 1.0,
    precision_candidates: Annotated[int, typer.Option(
        help="fp32 front variants (fastest first) quantised at each extra precision.")] = 8,

    offload_link: Annotated[str | None, typer.Option(
        help="Price every variant at its best offload cut for this link: BANDWIDTH_MBIT_S,RTT_MS[,PEER_SPEEDUP"
             "[,CODEC]] (e.g. 20,5,4,int8: 20 Mbit/s, 5 ms, a peer 4x faster). Latency = device part + RTT + "
             "bytes/bandwidth + peer part; the front's points carry offload_cut.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the search and of the data subset.")] = 0,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Find the Pareto front of accuracy (measured on held-out data) against predicted latency,
    energy and memory on one device, within budgets: NSGA-II seeded and mutated near the
    budgets, candidates evaluated in groups with prefix-feature reuse. Writes the front, a
    runtime index, the archive and a plot."""

    def body(output: Output) -> None:
        import math

        from commands._checks import check_budget_flags, check_device_flag
        from hmt.errors import UsageError
        from hmt.pareto import BudgetSweep, ParetoOptions, SearchOptions, find_front
        from hmt.pareto.budgets import describe
        from hmt.pareto.precision import PrecisionOptions
        from hmt.pareto.run import check_inputs

        check_budget_flags(latency_ms=latency_ms, energy_mj=energy_mj, memory_mb=memory_mb)
        check_device_flag(device, allow_auto=False)
        if not greedy_drop >= 0 or not math.isfinite(greedy_drop):  # NaN crashed writing the front, after the search
            raise UsageError(f"--greedy-drop must be >= 0 accuracy points, got {greedy_drop}")
        options = ParetoOptions(
            budgets=BudgetSweep.of(latency_ms=latency_ms, energy=energy_mj, memory_mb=memory_mb),
            search=SearchOptions(method=method.value, evaluations=evaluations, population=population, seed=seed,
                                 objectives=tuple(o.strip() for o in objectives.split(",") if o.strip()),
                                 window=window, noise_prob=noise_prob, coverage_share=coverage_share,
                                 greedy_share=greedy_share, greedy_drop=greedy_drop / 100.0),
            data_path=data, data_split=data_split.value, max_eval_samples=max_eval_samples, batch_size=batch_size,
            cache_mb=cache_mb, device=device, use_block_table=not no_block_table, threads=threads,
            calibration_samples=calibration_samples, offload_link=offload_link, candidates_path=candidates,
            precision=PrecisionOptions(precisions=("fp32", *(precision or [])),
                                       max_accuracy_drop=max_accuracy_drop / 100.0,
                                       max_candidates=precision_candidates),
        ).validate()
        check_inputs(supernet, profile, out, options, force=force)
        what = _what_runs(supernet, method.value, evaluations, candidates)
        output.note(f"searching {supernet} for {profile} ({what}, {describe(options.budgets.limits(), 'mJ')}) -> {out}")
        with output.progress() as progress:
            run = find_front(supernet, profile, out, options, progress=progress, force=force)
        unit = run.energy_unit
        rows: list[list[Any]] = [
            [p["arch_id"], p["exit_stage"], f"{100 * p['accuracy']:.2f}", f"{p['latency_ms']:.3f}",
             f"{p['energy']:.4g}", f"{p['memory_mb']:.3f}"]
            for p in run.points[:20]
        ]
        output.table(f"front ({len(run.points)} points{', first 20 by latency' if len(run.points) > 20 else ''})",
                     ["arch id", "exit", "acc %", "latency ms", f"energy {unit}", "memory MB"], rows)
        if run.answers and run.answers[0].budgets:
            output.table("best within each budget", ["budgets", "arch id", "acc %"], [
                [describe(a.budgets, unit), a.point["arch_id"] if a.point else "none (see note)",
                 f"{100 * a.point['accuracy']:.2f}" if a.point else "-"] for a in run.answers])
        for note in run.notes:
            output.warn(note) if note.startswith("nothing") else output.note(f"note: {note}")
        m = run.metrics
        output.result(
            {"out": str(run.out), "metrics": m, "answers": [a.to_json_dict() for a in run.answers],
             "notes": run.notes},
            f"wrote {run.out}: {m['front_size']} front points from {m['evaluations']} evaluations "
            f"({m['archive_size']} variants measured with their earlier exits; {m['generations']} generations, "
            f"{m['search_wall_s']:.1f} s); prefix reuse ran {m['block_evals']} of {m['block_evals_plain']} "
            f"block evaluations, BN calibration included ({100 * m['reuse_saved_fraction']:.0f}% saved)",
        )

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)


def _what_runs(supernet: Path, method: str, evaluations: int, candidates: Path | None) -> str:
    """The search the run will do, as the note before it says it (auto resolved as find_front does)."""
    from hmt.artifacts import load_artifact
    from hmt.pareto.candidates import is_specialized, resolve_method
    from hmt.supernet.artifact import KIND

    if method == "auto":
        config = load_artifact(supernet, kind=KIND, verify_checksums=False).manifest.config
        method = resolve_method(method, is_specialized(config), candidates)
    if method == "listed":
        return f"listed: the variants of {candidates.name if candidates else 'its variants.csv'}, no search"
    return f"{method}, {evaluations} evaluations"
