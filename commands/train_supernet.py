"""``hmt train-supernet``: train the elastic supernet and write its artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
from hmt.supernet.presets import PRESETS

_EPILOG = """
Examples:

  # the embedded default: a tiny CIFAR ResNet on 2,000 images, a few minutes on a laptop CPU
  hmt train-supernet --preset tiny --out runs/supernet

  # full CIFAR-10 on a GPU, starting from nothing, ResNet-18 backbone
  hmt train-supernet --preset cifar10 --data ../shared/datasets/cifar10-jpeg --out runs/r18

  # your own model elastified (AdaptiveNet): blocks found by torch.fx, the original path kept exact
  hmt train-supernet --model net.py:build --weights net.safetensors --input-shape 1,3,32,32 \\
      --data ../shared/datasets/cifar10-jpeg --out runs/mine

  # a torchvision architecture with your weights (no download), or trained here first on request
  hmt train-supernet --torchvision mobilenet_v2 --weights mbv2.safetensors --input-shape 1,3,32,32 \\
      --data ../shared/datasets/cifar10-jpeg --out runs/mbv2
  hmt train-supernet --torchvision mobilenet_v2 --train-original --backbone-epochs 30 --input-shape 1,3,32,32 \\
      --data ../shared/datasets/cifar10-jpeg --out runs/mbv2

  # ResNet-56 elastified from its pretrained weights
  hmt train-supernet --backbone cifar_resnet56 --pretrained ../shared/models/resnet-cifar10/resnet56-4bfd9763.th \\
      --data ../shared/datasets/cifar10-jpeg --backbone-epochs 10 --out runs/r56

Kill it at any time and rerun the same command: it resumes from the last epoch's checkpoint
(OUT.ckpt/ beside the output). Several GPUs: torchrun --nproc-per-node 2 scripts/ddp_train.py train-supernet ...
"""


@app.command("train-supernet", epilog=_EPILOG)
def train_supernet_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")] = Path(
        "runs/supernet"
    ),
    preset: Annotated[str | None, typer.Option(help=f"Start from a preset: {', '.join(PRESETS)}.")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="JSON file of training options (overrides the preset).")
    ] = None,
    backbone: Annotated[str | None, typer.Option(help="Backbone (see --list-backbones).")] = None,
    dataset: Annotated[str | None, typer.Option(help="Dataset kind: cifar10, mnist, basicmotions, fsdd.")] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="Dataset location; default: the embedded CIFAR-10 subset.")
    ] = None,
    pretrained: Annotated[
        Path | None, typer.Option(help="Weights of the original network (loaded weights-only).")
    ] = None,
    operators: Annotated[
        str | None, typer.Option(help="Comma-separated operators to offer, e.g. w50,lr50,skip.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of every random draw.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Training batch size per device.")] = None,
    backbone_epochs: Annotated[
        int | None, typer.Option(help="Epochs of phase 1 (backbone / pretrained fine-tuning; for "
                                 "--model/--torchvision only with --train-original).")
    ] = None,
    partition_epochs: Annotated[
        int | None, typer.Option(help="Epochs per partition of phase 2 (AdaScale Alg. 1).")
    ] = None,
    partition_mode: Annotated[
        str | None, typer.Option(help="freeze or update-if-better (Alg. 1 modes a and b).")
    ] = None,
    distill_epochs: Annotated[int | None, typer.Option(help="Epochs of phase 3 (branch-wise distillation).")] = None,
    finetune_epochs: Annotated[int | None, typer.Option(help="Epochs of phase 4 (sampled-subnet fine-tuning).")] = None,
    eval_variants: Annotated[
        int | None, typer.Option(help="Random variants in the table (plus largest and smallest).")
    ] = None,
    max_train_samples: Annotated[int | None, typer.Option(help="Use at most this many training samples.")] = None,
    finetune_original: Annotated[
        bool | None,
        typer.Option(
            "--finetune-original/--keep-original",
            help="Train the original network along with the alternatives. Default: it is frozen after "
            "phase 1, so the largest variant is your network, exact.",
        ),
    ] = None,
    checkpoint_dir: CheckpointDirOpt = None,
    restart: RestartOpt = False,
    keep_checkpoint: KeepCheckpointOpt = False,
    cache_dir: CacheDirOpt = None,
    list_backbones: Annotated[
        bool, typer.Option("--list-backbones", help="List the built-in backbones and exit.")
    ] = False,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Elastify your own model: path/to/file.py:factory returning an nn.Module."),
    ] = None,
    torchvision_name: Annotated[
        str | None, typer.Option("--torchvision", help="Elastify a torchvision architecture, e.g. resnet18.")
    ] = None,
    weights: Annotated[
        Path | None,
        typer.Option(help="Weights of --model/--torchvision (.safetensors or torch.save state dict, weights-only), "
                     "kept exactly as given; without them the model is kept as the factory returns it."),
    ] = None,
    train_original: Annotated[
        bool,
        typer.Option("--train-original", help="Train the --model/--torchvision network here first, for "
                     "--backbone-epochs epochs (from --weights if given), then elastify it. Without it your "
                     "weights are the original, unchanged; --torchvision without --weights needs it."),
    ] = False,
    input_shape: Annotated[
        str | None, typer.Option(help="Input shape with batch for --model/--torchvision: 1,3,32,32 or 1,C,L (1-D).")
    ] = None,
    leaf: Annotated[
        list[str] | None,
        typer.Option("--leaf", help="Keep this submodule (e.g. layer2.0.gate) as one opaque, unchanged block; "
                     "the way out for code torch.fx cannot trace. Repeatable."),
    ] = None,
    force: ForceOpt = False,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train one elastic supernet (compression operators eta1-eta6 per block, an early exit
    per stage) with the four-phase recipe, then measure the largest, the smallest and
    random variants. Writes weights (safetensors), the search space, a per-variant CSV,
    training curves and a manifest."""

    def body(output: Output) -> None:
        if list_backbones:
            _list_backbones(output)
            return
        from commands._checks import check_device_flag
        from hmt.supernet.train import check_training_outputs, default_checkpoint_dir, resolve_config, train_supernet

        check_device_flag(device)

        overrides: dict[str, Any] = {
            "backbone": backbone,
            "dataset": dataset,
            "data_path": str(data) if data else None,
            "pretrained": str(pretrained) if pretrained else None,
            "operators": [o.strip() for o in operators.split(",") if o.strip()] if operators else None,
            "seed": seed,
            "device": device,
            "batch_size": batch_size,
            "backbone_epochs": backbone_epochs,
            "partition_epochs": partition_epochs,
            "partition_mode": partition_mode,
            "distill_epochs": distill_epochs,
            "finetune_original": finetune_original,
            "finetune_epochs": finetune_epochs,
            "eval_variants": eval_variants,
            "max_train_samples": max_train_samples,
        }
        if model is not None or torchvision_name is not None:
            overrides["extra"] = _elastify_extra(model, torchvision_name, weights, input_shape, leaf or [],
                                                 bool(finetune_original), train_original)
            resolved = resolve_config(preset=preset, config_file=config, overrides=overrides)
            _elastify(output, resolved, out, cache_dir, checkpoint_dir, restart, keep_checkpoint, force)
            return
        if weights is not None or leaf or input_shape is not None or train_original:
            from hmt.errors import UsageError

            raise UsageError("--weights, --input-shape, --leaf and --train-original go with --model or --torchvision")
        resolved = resolve_config(preset=preset, config_file=config, overrides=overrides)
        check_training_outputs(resolved, out, checkpoint_dir or default_checkpoint_dir(out), force=force)
        output.note(
            f"training {resolved.backbone} supernet on {resolved.dataset} "
            f"({resolved.data_path or 'embedded subset'}) -> {out}"
        )
        with output.progress() as progress:
            result = train_supernet(
                resolved,
                out,
                checkpoint_dir=checkpoint_dir,
                restart=restart,
                keep_checkpoint=keep_checkpoint,
                cache_dir=cache_dir,
                progress=progress,
                force=force,
                notify=output.note,
            )
        if result is not None:
            _report_trained(output, out, result)

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)


def _report_trained(output: Output, out: Path, result: Any) -> None:
    """The variant table and the summary line of a preset/backbone training."""
    m = result.metrics
    table = result.variants.sort_values("params", ascending=False)
    rows = [[r.arch_id, r.role, r.exit_stage, f"{100 * r.val_acc:.2f}", f"{100 * r.test_acc:.2f}",
             f"{r.params / 1e6:.3f}", f"{r.macs / 1e6:.1f}"] for r in table.head(12).itertuples()]
    output.table("variants (largest 12 by parameters)",
                 ["arch id", "role", "exit", "val %", "test %", "params M", "MMACs"], rows)
    output.result(
        {"out": str(out), "metrics": m},
        f"wrote {out}: largest {100 * m['largest_test_acc']:.2f}% test, "
        f"smallest {100 * m['smallest_test_acc']:.2f}% "
        f"({m['variants_evaluated']} variants in {out / 'variants.csv'})",
    )


def _list_backbones(output: Output) -> None:
    from hmt.supernet.backbones import BACKBONES

    output.result({"backbones": sorted(BACKBONES)}, "\n".join(sorted(BACKBONES)))


def _elastify_extra(
    model: str | None, torchvision_name: str | None, weights: Path | None, input_shape: str | None,
    leaves: list[str], finetune_original: bool, train_original: bool,
) -> dict[str, Any]:
    from hmt.convert.sources import parse_shape
    from hmt.errors import UsageError
    from hmt.supernet.elastify import ModelSpec
    from hmt.supernet.elastify.source import parse_model_option

    if input_shape is None:
        raise UsageError("--input-shape is required with --model/--torchvision, e.g. 1,3,32,32 (or 1,C,L for 1-D)")
    file, factory = parse_model_option(model) if model is not None else (None, None)
    spec = ModelSpec(input_shape=parse_shape(input_shape), file=file, factory=factory, torchvision=torchvision_name,
                     weights=str(weights) if weights else None, leaves=tuple(leaves)).validate()
    spec.check_files()
    return {"elastify": spec.to_json_dict(), "finetune_original": finetune_original,
            "train_original": train_original}


def _elastify(
    output: Output, resolved: Any, out: Path, cache_dir: Path | None, checkpoint_dir: Path | None, restart: bool,
    keep_checkpoint: bool, force: bool,
) -> None:
    from hmt.supernet.elastify.train import elastify_supernet
    from hmt.supernet.train import check_training_outputs, default_checkpoint_dir

    spec = resolved.extra["elastify"]
    check_training_outputs(resolved, out, checkpoint_dir or default_checkpoint_dir(out), force=force,
                           inputs=(spec.get("file"), spec.get("weights")))
    what = spec["torchvision"] or f"{spec['file']}:{spec['factory']}"
    output.note(f"elastifying {what} on {resolved.dataset} ({resolved.data_path or 'embedded subset'}) -> {out}")
    from hmt.supernet.elastify.source import ModelSpec
    from hmt.supernet.elastify.train import original_note, train_original_of

    model_spec = ModelSpec.from_json_dict(spec)
    output.note("the original: " + original_note(train_original_of(resolved, model_spec), resolved, model_spec))
    with output.progress() as progress:
        result = elastify_supernet(resolved, out, cache_dir=cache_dir, progress=progress,
                                   checkpoint_dir=checkpoint_dir, restart=restart, keep_checkpoint=keep_checkpoint,
                                   force=force, notify=output.note)
    if result is None:
        return  # another torchrun rank: rank 0 writes and reports
    m, report = result.metrics, result.report
    rows = [[b["name"], _modules_label(b), b["kind"], " ".join(b["choices"])] for b in report["blocks"]]
    output.table("blocks (choices offered; notes in elastify.json)", ["block", "module", "kind", "choices"], rows)
    output.result(
        {"out": str(out), "metrics": m, "report": report},
        f"wrote {out}: original ({m['original_weights']}) {100 * m['original_test_acc']:.2f}% test = "
        f"largest {100 * m['largest_test_acc']:.2f}% "
        f"(max abs {m['largest_vs_original_max_abs_after']:.1e}), smallest {100 * m['smallest_test_acc']:.2f}%; "
        f"{m['blocks']} blocks ({m['blocks_kept_unchanged']} kept unchanged), elastified in {m['elastify_s']:.0f} s",
    )


def _modules_label(block: dict[str, Any]) -> str:
    """The user's module a block is, else the range of layers it spans."""
    if block["owner"]:
        return str(block["owner"])
    modules = block["modules"]
    if not modules:
        return "-"
    return modules[0] if len(modules) == 1 else f"{modules[0]} .. {modules[-1]}"
