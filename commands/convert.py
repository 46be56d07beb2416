"""``hmt convert``: a model -> verified, simplified static ONNX graphs (a "converted" artifact)."""

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

Your own torch model (a factory function in a .py file), weights as safetensors:

    hmt convert --model models/net.py:build --weights net.safetensors --input-shape 1,3,32,32 --out runs/converted

An existing ONNX file (external data is read only from inside its folder):

    hmt convert --onnx model.onnx --out runs/converted

Variants of a supernet artifact (segments + early-exit heads as separate graphs):

    hmt convert --supernet runs/supernet --variant largest --variant smallest --out runs/converted

INT8 beside fp32 (QDQ, calibrated on the supernet's images; refused past 1 point lost):

    hmt convert --supernet runs/supernet --variant largest --variant largest.int8 --out runs/converted

  Every point of a Pareto front (or 4 spread along it):

    hmt convert --supernet runs/supernet --pareto runs/pareto --max-variants 4 --out runs/converted

Each graph goes through pass 1 (fusion, duplicate/identity/no-op removal), pass 2 (constant
folding), onnx.checker, and ONNX Runtime vs the reference on seeded inputs; above
--atol + --rtol x max|reference| nothing is written. Next: hmt fuse runs/converted.
"""


class ExporterChoice(str, Enum):
    auto = "auto"
    torchscript = "torchscript"
    dynamo = "dynamo"


class FolderChoice(str, Enum):
    onnxslim = "onnxslim"
    onnxsim = "onnxsim"


@app.command("convert", epilog=_EPILOG)
def convert_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")] = Path(
        "runs/converted"
    ),
    model: Annotated[str | None, typer.Option(
        "--model", help="A torch model: path/to/file.py:factory_function.")] = None,
    weights: Annotated[Path | None, typer.Option(
        "--weights", help="Weights for --model: .safetensors or a state dict (loaded weights_only).")] = None,
    input_shape: Annotated[list[str] | None, typer.Option(
        "--input-shape", help="Input shape with batch, e.g. 1,3,32,32 (repeat for several inputs).")] = None,
    onnx_file: Annotated[Path | None, typer.Option("--onnx", help="An ONNX file to convert.")] = None,
    supernet: Annotated[Path | None, typer.Option("--supernet", help="A supernet artifact directory.")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", help="Variant id of --supernet (repeatable; the space tag may be left out: e3.555555555555; "
        "also 'largest', 'smallest'). A '.int8' or "
        "'.fp16' suffix quantises it (measured on the supernet's held-out images).")] = None,
    pareto: Annotated[Path | None, typer.Option(
        "--pareto", help="A pareto artifact searched on --supernet: convert the points of its front.")] = None,
    max_variants: Annotated[int | None, typer.Option(
        "--max-variants", min=1, help="With --pareto: at most N points, spread along the front (fastest and "
        "most accurate kept).")] = None,
    min_accuracy: Annotated[float | None, typer.Option(
        "--min-accuracy", help="With --pareto: leave out front points below this accuracy (percent, as the front "
        "measured it), e.g. 85; the spread of --max-variants is then taken over the rest.")] = None,
    batch: Annotated[int, typer.Option("--batch", help="Batch size of supernet variants.")] = 1,
    name: Annotated[str, typer.Option("--name", help="Folder name of a --model/--onnx variant.")] = "model",
    opset: Annotated[int, typer.Option("--opset", help="ONNX opset of the export.")] = 17,
    exporter: Annotated[ExporterChoice, typer.Option(
        "--exporter", help="torch exporter: auto (TorchScript, then dynamo), torchscript or dynamo.")
    ] = ExporterChoice.auto,
    folder: Annotated[FolderChoice, typer.Option(
        "--folder", help="Constant folder of pass 2.")] = FolderChoice.onnxslim,
    atol: Annotated[float, typer.Option("--atol", help="Absolute tolerance of the verification.")] = 1e-4,
    rtol: Annotated[float, typer.Option("--rtol", help="Tolerance relative to max |reference output|.")] = 1e-3,
    max_accuracy_drop: Annotated[float, typer.Option(
        "--max-accuracy-drop", help="Refuse a quantised variant (.int8/.fp16) losing more than this many points "
        "(0-100) against its fp32 chain on the held-out images.")] = 1.0,
    accuracy_samples: Annotated[int | None, typer.Option(
        "--accuracy-samples", help="Measure quantised variants on a stratified subset of this many held-out "
        "images (default: all of the supernet's validation split).")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", help="Held-out data for the quantised variants' accuracy check (a dataset folder, e.g. "
        "../shared/datasets/cifar10-jpeg; its test split), when the supernet's training data is not on this "
        "machine.")] = None,
    force: ForceOpt = False,
    seed: SeedOpt = 0,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Convert a model to verified ONNX: a torch factory (--model), an ONNX file (--onnx) or
    supernet variants (--supernet + --variant). Writes one folder per variant, a report with
    node counts by op type before/after each pass, and the max abs/relative error."""

    def body(output: Output) -> None:
        from hmt.convert import (
            ConvertOptions,
            OnnxSource,
            SupernetSource,
            TorchSource,
            convert_model,
            parse_shape,
        )
        from hmt.convert.sources import safe_variant_name
        from hmt.errors import UsageError

        if batch < 1:
            raise UsageError(f"--batch must be >= 1, got {batch}")
        given = [flag for flag, value in (("--model", model), ("--onnx", onnx_file), ("--supernet", supernet)) if value]
        if len(given) != 1:
            raise UsageError("give exactly one of --model, --onnx or --supernet (see hmt convert --help)")
        if (pareto or max_variants or min_accuracy is not None) and not supernet:
            raise UsageError("--pareto, --max-variants and --min-accuracy go with --supernet")
        if (max_variants or min_accuracy is not None) and not pareto:
            raise UsageError("--max-variants and --min-accuracy go with --pareto")
        if min_accuracy is not None and not 0.0 <= min_accuracy <= 100.0:
            raise UsageError(f"--min-accuracy is a percentage in [0, 100], got {min_accuracy:g}")
        if min_accuracy is not None and 0.0 < min_accuracy <= 1.0:
            # A fraction (as manifests store accuracy) would keep every point above ~1 %: surely not meant.
            raise UsageError(f"--min-accuracy is a percentage: {min_accuracy:g} keeps front points above "
                             f"{min_accuracy:g} %; for {100 * min_accuracy:g} % give {100 * min_accuracy:g}")
        shapes = tuple(parse_shape(s) for s in input_shape) if input_shape else None
        source: TorchSource | OnnxSource | SupernetSource
        if model:
            if shapes is None:
                raise UsageError("--model needs --input-shape, e.g. --input-shape 1,3,32,32")
            source = TorchSource(model, shapes, weights, name=safe_variant_name(name))
        elif onnx_file:
            source = OnnxSource(onnx_file, name=safe_variant_name(name))
        else:
            assert supernet is not None
            source = SupernetSource(supernet, tuple(variant or ()), batch=batch, pareto_dir=pareto,
                                    max_variants=max_variants,
                                    min_accuracy=None if min_accuracy is None else min_accuracy / 100.0)
        if weights and not model:
            raise UsageError("--weights goes with --model")
        options = ConvertOptions(opset=opset, exporter=exporter.value, folder=folder.value,
                                 seed=seed, atol=atol, rtol=rtol, max_accuracy_drop=max_accuracy_drop / 100.0,
                                 accuracy_samples=accuracy_samples, data_path=data)
        with output.progress() as progress:
            result = convert_model(source, out, options=options, onnx_input_shapes=shapes if onnx_file else None,
                                   progress=progress, force=force)
        rows = []
        for v in result.variants:
            doc = v.to_json()
            rows.append([v.name, len(v.graphs), doc["nodes_before"], doc["nodes_after"],
                         f"{v.max_abs_error:.2e}", f"{v.max_rel_error:.2e}"])
        output.table("converted", ["variant", "graphs", "nodes before", "nodes after", "max abs err", "max rel err"],
                     rows)
        output.result(
            {"out": str(out), "report": result.report},
            f"wrote {out}: {len(result.variants)} variant(s), verified against the reference",
        )

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)
