"""``hmt specialize``: fine-tune chosen variants of an elastified supernet (Once-for-All's
specialization) and write them as a supernet artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from commands._options import (
    CacheDirOpt,
    CheckpointDirOpt,
    DebugOpt,
    ForceOpt,
    JsonOpt,
    KeepCheckpointOpt,
    QuietOpt,
    RestartOpt,
)
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
Examples:

  # the width-0.5 ResNet-18 of an elastified supernet, 40 epochs on its own
  hmt specialize --supernet runs/r18 --variants e3.555555555555 --epochs 40 \\
      --data ../shared/datasets/cifar10-jpeg --out runs/r18-w50

  # the cheapest variant (fewest MACs) within 1 point of the original on the validation split
  hmt specialize --supernet runs/r18 --front-within 1 --candidates runs/r18-front.csv --epochs 40 \\
      --data ../shared/datasets/cifar10-jpeg --out runs/r18-1pt

  # distil from an ensemble: the original and two more trainings of its architecture
  hmt specialize --supernet runs/r18 --variants e3.555555555555 --epochs 200 \
      --teacher-weights r18-seed1.safetensors --teacher-weights r18-seed2.safetensors \
      --data ../shared/datasets/cifar10-jpeg --out runs/r18-w50-ens

  # then convert it as any supernet variant
  hmt convert --supernet runs/r18-w50 --variant e3.555555555555 --out runs/r18-w50.onnx

Kill it at any time and rerun the same command: it resumes from the last checkpoint (OUT.ckpt/).
"""


@app.command("specialize", epilog=_EPILOG)
def specialize_command(
    supernet: Annotated[Path, typer.Option("--supernet", "-s", help="An elastified supernet artifact.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output supernet artifact (replaced atomically).")],
    variants: Annotated[
        str | None, typer.Option("--variants", help="Comma-separated arch ids to specialize (the space tag may be "
                                 "left out: e3.555555555555).")
    ] = None,
    front_within: Annotated[
        float | None, typer.Option("--front-within", help="Also the variant with the fewest MACs within POINTS "
                                   "accuracy points of the largest, on the validation split.")
    ] = None,
    candidates: Annotated[
        Path | None, typer.Option("--candidates", help="CSV that --front-within chooses from (arch_id, val_acc, "
                                  "macs; e.g. a front); default: the supernet's variants.csv.")
    ] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="Fine-tuning epochs.")] = 30,
    lr: Annotated[float | None, typer.Option("--lr", help="Peak learning rate (default: the supernet's "
                                             "fine-tuning lr).")] = None,
    exits: Annotated[
        str, typer.Option("--exits", help="How the early exits train: 'detached' (their heads learn on the "
                          "blocks' features; the blocks serve the variant's own exit only) or 'joint' (their "
                          "losses move the blocks too, as elastification's fine-tuning).")
    ] = "detached",
    kd_temperature: Annotated[
        float | None, typer.Option("--kd-temperature", help="Distillation temperature (default: the supernet's).")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", help="Training-order seed (0: the supernet's). The training and validation "
                          "split stay the supernet's, so runs with several seeds compare on the same images.")
    ] = 0,
    teacher_weights: Annotated[
        list[Path] | None,
        typer.Option("--teacher-weights", metavar="<path>",
                     help="Weights of the original's own architecture trained again (another seed, say), "
                     "repeatable: each teaches beside the original, the soft targets averaged over all (an "
                     "ensemble teacher). Recorded by name and sha256.")
    ] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="The data the supernet was trained on (checked by sha256); "
                                  "default: where its manifest says.")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    batch_size: Annotated[int | None, typer.Option(help="Training batch size (default: the supernet's).")] = None,
    max_train_samples: Annotated[int | None, typer.Option(help="Use at most this many training samples.")] = None,
    checkpoint_dir: CheckpointDirOpt = None,
    restart: RestartOpt = False,
    keep_checkpoint: KeepCheckpointOpt = False,
    cache_dir: CacheDirOpt = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Fine-tune only the chosen variants' paths (cross-entropy + distillation from the frozen
    original, as elastification's fine-tuning) and write a supernet artifact whose variants.csv
    holds them, re-evaluated on the validation and test splits; the original stays exact."""

    def body(output: Output) -> None:
        from commands._checks import check_device_flag
        from hmt.supernet.elastify.selection import SpecializeRequest

        check_device_flag(device)
        from hmt.supernet.elastify.specialize import specialize_supernet

        request = SpecializeRequest(
            variants=tuple(v for v in (variants or "").split(",") if v.strip()) if variants is not None else (),
            front_within=front_within, candidates=str(candidates) if candidates else None, epochs=epochs, lr=lr,
            data_path=str(data) if data else None, device=device, batch_size=batch_size,
            max_train_samples=max_train_samples, exits=exits, kd_temperature=kd_temperature, seed=seed,
            teachers=tuple(str(p) for p in teacher_weights or ()),
        ).validate()
        if variants is not None and not request.variants:
            from hmt.errors import UsageError

            raise UsageError("--variants: no variant id given; expected ids like e3.555555555555, comma-separated")
        output.note(f"specializing {supernet} -> {out}")
        with output.progress() as progress:
            result = specialize_supernet(supernet, out, request, cache_dir=cache_dir, checkpoint_dir=checkpoint_dir,
                                         restart=restart, keep_checkpoint=keep_checkpoint, force=force,
                                         progress=progress, notify=output.note)
        rows = []
        for r in result.variants.itertuples():
            b = result.before[result.before.arch_id == r.arch_id].iloc[0]
            rows.append([r.arch_id, r.role, f"{100 * b.val_acc:.2f}", f"{100 * r.val_acc:.2f}",
                         f"{100 * b.test_acc:.2f}", f"{100 * r.test_acc:.2f}", f"{r.macs / 1e6:.1f}"])
        output.table("variants (before -> after)", ["arch id", "role", "val % before", "val %", "test % before",
                                                     "test %", "MMACs"], rows)
        m = result.metrics
        output.result({"out": str(out), "metrics": m},
                      f"wrote {out}: {len(m['specialized'])} variant(s) specialized for {m['epochs']} epochs "
                      f"({m['exits']} exits) in {m['specialize_train_s']:.0f} s (original exact: max abs "
                      f"{m['largest_vs_original_max_abs_after']:.1e})")

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)
