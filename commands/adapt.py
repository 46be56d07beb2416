"""``hmt adapt``: test-time adaptation offline (BN re-estimation or TENT), guarded, with the
memory-saving training engine."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from commands._options import DebugOpt, ForceOpt, JsonOpt, QuietOpt, SeedOpt
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
**Examples**

Build the shift benchmark (CIFAR-10-C-style corruptions of the 10k test images, severities 3 and 5):

    python3 scripts/make_corruptions.py --data ../shared/datasets/cifar10-jpeg --out runs/cifar10-c

TENT on the supernet's largest variant, each corruption at severity 5, 2,000 images each:

    hmt adapt runs/r20 --data runs/cifar10-c --set gaussian_noise-s5 --set defocus_blur-s5 --limit 2000 \\
        --out runs/adapted

BN re-estimation only (no gradients), a small variant, a labelled canary of 100 images per set:

    hmt adapt runs/r20 --arch smallest --method bn --data runs/cifar10-c --canary-size 100 --out runs/adapted-bn

TENT within an activation-memory budget (8-bit saved activations + recomputation + updates in backward):

    hmt adapt runs/r20 --data runs/cifar10-c --memory-budget-mb 4 --out runs/adapted

The torch-free path a device runs: export the variant's BN-adaptable graphs, then adapt them with
ONNX Runtime and numpy only:

    hmt adapt runs/r20 --arch largest --export-bn runs/r20-bn
    hmt adapt runs/r20-bn --method bn --data runs/cifar10-c --out runs/adapted-ort

Each set is adapted from the source model; the adapted variant is kept (OUT/variants/SET.safetensors,
its BN tensors) only when its mean prediction entropy fell and the canary set, if any, did not lose
more than --canary-tolerance. OUT/report.json has accuracy and entropy before and after, TENT's online
accuracy, milliseconds per adaptation batch and the guard's reason.
"""


class MethodChoice(str, Enum):
    tent = "tent"
    bn = "bn"


@app.command("adapt", epilog=_EPILOG)
def adapt_command(
    model: Annotated[Path, typer.Argument(
        help="A supernet artifact (a variant is materialised) or a bn-adaptable artifact (--export-bn).")],
    data: Annotated[Path | None, typer.Option(
        "--data", help="A shift set (scripts/make_corruptions.py) or a CIFAR-10 source (its test split).")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")] = Path(
        "runs/adapted"),
    arch: Annotated[str | None, typer.Option(
        "--arch", help="Variant of a supernet: an arch id (the space tag may be left out), 'largest' (default) "
                        "or 'smallest'.")] = None,
    method: Annotated[MethodChoice, typer.Option(
        "--method", help="tent: entropy minimisation of BN affine parameters; bn: re-estimate BN statistics.")] = (
        MethodChoice.tent),
    sets: Annotated[list[str] | None, typer.Option(
        "--set", help="Set of the shift set to adapt to (repeatable; default: all, clean included).")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", help="Class-balanced subset of each set (for quick runs).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images per adaptation batch.")] = 128,
    lr: Annotated[float, typer.Option("--lr", help="TENT learning rate (Adam).")] = 1e-3,
    canary_size: Annotated[int, typer.Option(
        "--canary-size", help="Labelled images per set held out as the canary (0: none).")] = 0,
    canary_tolerance: Annotated[float, typer.Option(
        "--canary-tolerance", help="Canary accuracy (0..1) the adapted variant may lose.")] = 0.0,
    canary_only: Annotated[bool, typer.Option(
        "--canary-only",
        help="Keep a variant on the canary alone, even if its entropy rose (needs --canary-size).")] = False,
    memory_budget_mb: Annotated[float | None, typer.Option(
        "--memory-budget-mb", help="TENT: activation budget; recomputation is chosen to fit it.")] = None,
    plain: Annotated[bool, typer.Option(
        "--plain-autograd", help="TENT without the memory-saving engine (the baseline).")] = False,
    threads: Annotated[int | None, typer.Option(
        "--threads", help="Torch intra-op threads (1 on a shared machine avoids oversubscription).")] = None,
    export_bn: Annotated[Path | None, typer.Option(
        "--export-bn", help="Instead of adapting: write the variant's BN-adaptable graphs here.")] = None,
    force: ForceOpt = False,
    seed: SeedOpt = 0,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Adapt a model to shifted data without labels: re-estimate BN statistics, or minimise
    prediction entropy over the BN affine parameters (TENT) with the memory-saving engine.
    Measures accuracy before and after per set and keeps the adapted variants the guard accepts."""

    def body(output: Output) -> None:
        import math

        import torch

        from hmt.adapt.engine import EngineOptions
        from hmt.adapt.guard import GuardPolicy
        from hmt.adapt.offline import export_bn as do_export
        from hmt.adapt.offline import run_adapt
        from hmt.adapt.run import AdaptOptions
        from hmt.adapt.tent import TentOptions
        from hmt.errors import UsageError

        # refused before any work: torch's own errors for these were internal errors (exit 70)
        if threads is not None and threads < 1:
            raise UsageError(f"--threads must be >= 1, got {threads}")
        if limit is not None and limit < 1:
            raise UsageError(f"--limit must be >= 1 images per set, got {limit}")
        if memory_budget_mb is not None and not (memory_budget_mb > 0 and math.isfinite(memory_budget_mb)):
            raise UsageError(f"--memory-budget-mb must be a finite number > 0, got {memory_budget_mb}")
        torch.manual_seed(seed)
        if threads is not None:
            torch.set_num_threads(threads)
        if export_bn is not None:
            spec = do_export(model, export_bn, arch=arch, force=force)
            layers = sum(len(g["layers"]) for g in spec["graphs"])
            output.result({"out": str(export_bn), "graphs": len(spec["graphs"]), "bn_layers": layers},
                          f"wrote {export_bn}: {len(spec['graphs'])} graph(s), {layers} BN layer(s)")
            return
        if data is None:
            raise UsageError("--data is required (a shift set or a CIFAR-10 source), unless --export-bn")
        budget = None if memory_budget_mb is None else int(memory_budget_mb * 2**20)
        engine = (EngineOptions(compress=False, update_in_backward=False) if plain
                  else EngineOptions(compress=True, budget_bytes=budget, update_in_backward=True))
        if plain and budget is not None:
            raise UsageError("--memory-budget-mb needs the memory-saving engine; drop --plain-autograd")
        options = AdaptOptions(method=method.value, batch_size=batch_size,
                               tent=TentOptions(lr=lr, engine=engine),
                               guard=GuardPolicy(canary_tolerance=canary_tolerance,
                                                 require_entropy_drop=not canary_only), canary_size=canary_size,
                               seed=seed)
        if canary_only and canary_size == 0:
            raise UsageError("--canary-only needs a canary: give --canary-size N")
        with output.progress() as progress:
            report = run_adapt(model, data, out, arch=arch, method=method.value, names=sets, limit=limit,
                               options=options, progress=progress, force=force)
        rows = [[r["name"], r["images"], f"{100 * r['accuracy_before']:.2f}", f"{100 * r['accuracy_after']:.2f}",
                 f"{r['entropy_before']:.3f} -> {r['entropy_after']:.3f}", f"{r['adapt_ms_per_batch']:.0f}",
                 "kept" if r["accepted"] else "refused"] for r in report["sets"]]
        output.table(f"{method.value} on {report['config']['arch'] or model}",
                     ["set", "images", "acc before %", "acc after %", "entropy", "ms/batch", "guard"], rows)
        output.result({"out": str(out), **report}, f"wrote {out}")

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)
