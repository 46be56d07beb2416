"""``convert``: a model (torch factory, ONNX file or supernet variants) -> verified ONNX graphs.

For each graph: export (torch) or load (ONNX), pass 1 (fusion + redundancy removal),
pass 2 (constant classification + folding), ``onnx.checker`` full check, then ONNX
Runtime outputs compared with the reference (torch, or ORT on the original ONNX) on
seeded inputs. Any failure raises inside the ArtifactWriter, so nothing is written.

A variant with early exits becomes separate static graphs: ``segment_i.onnx`` (segment
0 reads the model input, segment i reads segment i-1's output) and ``exit_i.onnx``
(reads segment i's output, returns logits). Verification runs the chain in ORT from the
input, so error that accumulates along it is measured.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.artifacts import Artifact, ArtifactWriter
from hmt.convert.export import export_module
from hmt.convert.passes import PassStage, fold_constants, fuse_and_deduplicate
from hmt.convert.result import ConvertedGraph, ConvertedVariant, ConvertOptions, ConvertResult
from hmt.convert.sources import (
    ModelSource,
    OnnxSource,
    SupernetSource,
    TorchSource,
    apply_weights,
    example_inputs,
    load_factory_module,
    run_reference,
    safe_variant_name,
)
from hmt.convert.verify import compare, require
from hmt.errors import InputError, ModelError, UsageError
from hmt.graph.model import (
    check_model,
    graph_inputs,
    graph_outputs,
    load_onnx,
    op_counts,
    run_ort,
    save_onnx,
    seeded_inputs,
    unknown_ops,
)
from hmt.progress import ProgressCallback, no_progress

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import torch

REPORT_NAME = "report.json"
MIN_OPSET = 7  # the oldest opset torch's exporters write
CONVERTED_KIND = "converted"


def _optimise(model: onnx.ModelProto, options: ConvertOptions, *, what: str) -> tuple[onnx.ModelProto, list[PassStage]]:
    missing = unknown_ops(model)
    if missing:
        raise ModelError(f"{what}: unsupported operator(s) {', '.join(missing)} (no ONNX schema for them)")
    check_model(model, what=f"{what} (as exported)")
    model, stage1 = fuse_and_deduplicate(model, seed=options.seed)
    model, stage2 = fold_constants(model, folder=options.folder)
    check_model(model, what=f"{what} (after the passes)")
    return model, [stage1, stage2]


def _save(writer: ArtifactWriter, folder: str, file: str, model: onnx.ModelProto) -> str:
    rel = f"{folder}/{file}"
    save_onnx(model, writer.path(rel))
    return rel


def _export_graph(
    module: torch.nn.Module,
    inputs: list[torch.Tensor],
    *,
    input_names: list[str],
    output_names: list[str],
    options: ConvertOptions,
    what: str,
) -> tuple[onnx.ModelProto, str, list[PassStage]]:
    raw, exporter = export_module(module, inputs, input_names=input_names, output_names=output_names,
                                  opset=options.opset, exporter=options.exporter, what=what)
    model, stages = _optimise(raw, options, what=what)
    return model, exporter, stages


def _convert_torch_module(
    writer: ArtifactWriter, net: torch.nn.Module, shapes: tuple[tuple[int, ...], ...], *, name: str,
    arch_id: str | None, options: ConvertOptions,
) -> ConvertedVariant:
    inputs = example_inputs(shapes, seed=options.seed)
    reference = run_reference(net, inputs, what=name)
    input_names = ["input"] if len(inputs) == 1 else [f"input_{i}" for i in range(len(inputs))]
    output_names = ["logits"] if len(reference) == 1 else [f"output_{i}" for i in range(len(reference))]
    model, exporter, stages = _export_graph(net, inputs, input_names=input_names, output_names=output_names,
                                            options=options, what=name)
    feeds = {n: t.numpy() for n, t in zip(input_names, inputs, strict=True)}
    outputs = run_ort(model, feeds)
    variant = ConvertedVariant(name, arch_id)
    variant.comparisons.append(require(compare(f"{name}: ORT vs torch", reference, outputs,
                                               atol=options.atol, rtol=options.rtol)))
    file = _save(writer, name, "model.onnx", model)
    variant.graphs.append(ConvertedGraph(file, "model", 0, graph_inputs(model), graph_outputs(model), exporter, stages))
    return variant


def _convert_segmented(
    writer: ArtifactWriter, net: Any, shape: tuple[int, ...], *, name: str, arch_id: str | None,
    options: ConvertOptions,
) -> ConvertedVariant:
    """Segments + exit heads as separate graphs, verified as a chain."""
    import torch

    segments, heads = list(net.segments), list(net.exit_heads)
    if not segments or len(heads) != len(segments):
        raise ModelError(f"{name}: {len(segments)} segments but {len(heads)} exit heads; expected one head per segment")
    (x,) = example_inputs((shape,), seed=options.seed)
    variant = ConvertedVariant(name, arch_id)
    ort_features: np.ndarray = x.numpy()
    features = x
    for i, (segment, head) in enumerate(zip(segments, heads, strict=True)):
        segment.eval()
        head.eval()
        in_name = "input" if i == 0 else f"features_{i - 1}"
        seg_model, exporter, seg_stages = _export_graph(
            segment, [features], input_names=[in_name], output_names=[f"features_{i}"], options=options,
            what=f"{name} segment {i}",
        )
        with torch.no_grad():
            next_features = segment(features)
            logits = head(next_features)
        if not isinstance(next_features, torch.Tensor) or not isinstance(logits, torch.Tensor):
            raise ModelError(f"{name}: segment {i} and exit head {i} must each return one tensor")
        exit_model, exit_exporter, exit_stages = _export_graph(
            head, [next_features], input_names=[f"features_{i}"], output_names=[f"logits_{i}"], options=options,
            what=f"{name} exit {i}",
        )
        (ort_features,) = run_ort(seg_model, {in_name: ort_features})
        (ort_logits,) = run_ort(exit_model, {f"features_{i}": ort_features})
        variant.comparisons.append(require(compare(
            f"{name}: exit {i} through the ORT chain vs torch", [logits.numpy()], [ort_logits],
            atol=options.atol, rtol=options.rtol)))
        seg_file = _save(writer, name, f"segment_{i}.onnx", seg_model)
        exit_file = _save(writer, name, f"exit_{i}.onnx", exit_model)
        variant.graphs.append(ConvertedGraph(seg_file, "segment", i, graph_inputs(seg_model),
                                             graph_outputs(seg_model), exporter, seg_stages))
        variant.graphs.append(ConvertedGraph(exit_file, "exit", i, graph_inputs(exit_model),
                                             graph_outputs(exit_model), exit_exporter, exit_stages))
        features = next_features
    with torch.no_grad():
        full = net(x)
    if isinstance(full, torch.Tensor):
        variant.comparisons.append(require(compare(f"{name}: last exit vs the whole variant in torch",
                                                   [full.numpy()], [ort_logits], atol=options.atol,
                                                   rtol=options.rtol)))
    return variant


def _make_static(model: onnx.ModelProto, shapes: tuple[tuple[int, ...], ...] | None, *, what: str) -> list[str]:
    """Give symbolic input dims a value (the given shapes, else 1). Returns notes on what changed."""
    import onnx

    initializers = {init.name for init in model.graph.initializer}
    real_inputs = [v for v in model.graph.input if v.name not in initializers]
    if shapes is not None and len(shapes) != len(real_inputs):
        raise UsageError(f"{what}: {len(shapes)} --input-shape given, the model has {len(real_inputs)} inputs")
    notes = []
    changed = False
    for i, value in enumerate(real_inputs):
        dims = value.type.tensor_type.shape.dim
        wanted = shapes[i] if shapes is not None else None
        if wanted is not None and len(wanted) != len(dims):
            raise UsageError(f"{what}: input {value.name!r} has rank {len(dims)}, --input-shape gives {wanted}")
        for j, dim in enumerate(dims):
            static = dim.HasField("dim_value") and dim.dim_value > 0
            if wanted is not None and (not static or dim.dim_value != wanted[j]):
                if static:
                    raise UsageError(f"{what}: input {value.name!r} dim {j} is fixed at {dim.dim_value}, "
                                     f"--input-shape asks {wanted[j]}")
                dim.Clear()
                dim.dim_value = wanted[j]
                changed = True
            elif not static:
                dim.Clear()
                dim.dim_value = 1
                notes.append(f"input {value.name!r} dim {j} was symbolic; fixed to 1")
                changed = True
    if changed:
        del model.graph.value_info[:]
        for out in model.graph.output:
            out.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception as exc:
            raise ModelError(f"{what}: shape inference with static inputs failed ({exc})") from exc
        model.graph.ClearField("output")
        model.graph.output.extend(inferred.graph.output)
    return notes


def _convert_onnx(writer: ArtifactWriter, source: OnnxSource, shapes: tuple[tuple[int, ...], ...] | None, *,
                  options: ConvertOptions) -> tuple[ConvertedVariant, list[str]]:
    original = load_onnx(source.path)
    what = source.path.name
    missing = unknown_ops(original)
    if missing:
        raise ModelError(f"{source.path}: unsupported operator(s) {', '.join(missing)} (no ONNX schema for them)")
    notes = _make_static(original, shapes, what=what)
    check_model(original, what=str(source.path))
    feeds = seeded_inputs(graph_inputs(original), seed=options.seed)
    reference = run_ort(original, feeds, level="disable")
    model, stages = _optimise(original, options, what=what)
    outputs = run_ort(model, feeds)
    variant = ConvertedVariant(source.name, None)
    variant.comparisons.append(require(compare(f"{source.name}: converted vs original (ORT)", reference, outputs,
                                               atol=options.atol, rtol=options.rtol)))
    file = _save(writer, source.name, "model.onnx", model)
    variant.graphs.append(ConvertedGraph(file, "model", 0, graph_inputs(model), graph_outputs(model), "onnx-input",
                                         stages))
    return variant, notes


def _supernet_variants(source: SupernetSource) -> tuple[list[Artifact], list[tuple[str, Any]]]:
    from hmt.supernet import load_supernet

    loaded = load_supernet(source.artifact_dir)
    variant_ids = list(source.variant_ids)
    front_artifact: Artifact | None = None
    if source.pareto_dir is not None:
        from hmt.pareto.artifact import front_variant_ids, load_front

        front = load_front(source.pareto_dir)
        front_artifact = front.artifact
        variant_ids += front_variant_ids(front, supernet_manifest_sha256=loaded.artifact.manifest_sha256,
                                         max_variants=source.max_variants, min_accuracy=source.min_accuracy)
    if not variant_ids:
        raise UsageError("give at least one --variant ID (or 'largest' / 'smallest') or --pareto with a "
                         "supernet artifact")
    from hmt.precision import split_variant_id
    from hmt.precision import variant_id as precise_id

    variants = []
    for requested in variant_ids:
        base, precision = split_variant_id(requested)  # "<arch id>.int8": the arch, quantised
        arch = loaded.space.resolve(base)
        variants.append((precise_id(_arch_id(arch, base), precision), loaded.materialize(arch)))
    artifact = getattr(loaded, "artifact", None)
    parents = [a for a in (artifact, front_artifact) if isinstance(a, Artifact)]
    return parents, variants


def _arch_id(arch: Any, fallback: str) -> str:
    for attribute in ("arch_id", "id"):
        value = getattr(arch, attribute, None)
        if callable(value):
            value = value()
        if isinstance(value, str) and value:
            return value
    return fallback


def _fp32_id(vid: str) -> str:
    from hmt.precision import split_variant_id

    return split_variant_id(vid)[0]


def _check_options(options: ConvertOptions) -> None:
    """Refuse accuracy, tolerance and opset options out of range, before anything is converted (a NaN
    tolerance or opset 0 failed only after each exporter had been tried: minutes per variant)."""
    import onnx

    for flag, value in (("--atol", options.atol), ("--rtol", options.rtol)):
        if not (value >= 0 and math.isfinite(value)):
            raise UsageError(f"{flag} must be a finite number >= 0, got {value}")
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= options.opset <= newest:
        raise UsageError(f"--opset must be in {MIN_OPSET}..{newest} (this onnx's newest), got {options.opset}")
    if not 0.0 <= options.max_accuracy_drop <= 1.0:
        raise UsageError(f"--max-accuracy-drop must be 0-100 points, got {100 * options.max_accuracy_drop:g}")
    if options.accuracy_samples is not None and options.accuracy_samples < 1:
        raise UsageError(f"--accuracy-samples must be >= 1, got {options.accuracy_samples}")


def _run_config(source: ModelSource, options: ConvertOptions,
                onnx_input_shapes: tuple[tuple[int, ...], ...] | None, out_dir: Path | str) -> dict[str, Any]:
    """The config the artifact records: the options and the source, its paths relative to the artifact."""
    from hmt.artifacts.paths import relative_to_artifact

    def where(path: Path | str | None) -> str | None:
        return relative_to_artifact(path, out_dir) if path else None

    config: dict[str, Any] = {
        "opset": options.opset,
        "exporter": options.exporter,
        "constant_folder": options.folder,
        "seed": options.seed,
        "atol": options.atol,
        "rtol": options.rtol,
    }
    if isinstance(source, TorchSource):
        file, _, function = source.factory.rpartition(":")
        config["source"] = {"type": "torch", "factory": f"{where(file)}:{function}" if file else source.factory,
                            "weights": where(source.weights),
                            "input_shapes": [list(s) for s in source.input_shapes]}
    elif isinstance(source, OnnxSource):
        config["source"] = {"type": "onnx", "path": where(source.path),
                            "input_shapes": [list(s) for s in onnx_input_shapes] if onnx_input_shapes else None}
    else:
        config["source"] = {"type": "supernet", "artifact": where(source.artifact_dir),
                            "variants": list(source.variant_ids), "batch": source.batch,
                            "pareto": where(source.pareto_dir),
                            "max_variants": source.max_variants,
                            "min_accuracy": source.min_accuracy,
                            "max_accuracy_drop": options.max_accuracy_drop,
                            "accuracy_samples": options.accuracy_samples}
    return config


def _convert_torch(writer: ArtifactWriter, source: TorchSource, options: ConvertOptions) -> ConvertedVariant:
    """The factory's module, with its weights: segmented (one input, segments and exit heads)
    or as one graph."""
    net = load_factory_module(source.factory)
    if source.weights is not None:
        apply_weights(net, source.weights)
    if len(source.input_shapes) == 1 and hasattr(net, "segments") and hasattr(net, "exit_heads"):
        return _convert_segmented(writer, net, source.input_shapes[0], name=source.name, arch_id=None,
                                  options=options)
    return _convert_torch_module(writer, net, source.input_shapes, name=source.name, arch_id=None, options=options)


def _convert_supernet(writer: ArtifactWriter, source: SupernetSource, options: ConvertOptions,
                      progress: ProgressCallback) -> list[ConvertedVariant]:
    """Every requested supernet variant (each once) as segmented graphs, quantised where its id asks."""
    sources, materialised = _supernet_variants(source)
    writer.parents = tuple(a.as_parent() for a in sources)
    variants: list[ConvertedVariant] = []
    total = len(materialised)
    context = None  # calibration + held-out images, loaded at the first quantised variant
    for i, (arch_id, net) in enumerate(materialised):
        progress("convert", i, total, arch_id)
        name = safe_variant_name(arch_id)
        if any(v.name == name for v in variants):
            continue
        shape = (source.batch, *tuple(net.input_shape))
        variant = _convert_segmented(writer, net, shape, name=name, arch_id=arch_id, options=options)
        if variant.arch_id is not None and variant.arch_id != _fp32_id(variant.arch_id):
            from hmt.convert.precision import QuantContext, quantise_variant

            progress("quantise", i, total, arch_id)
            context = context or QuantContext.load(source.artifact_dir, options)
            quantise_variant(writer, variant, context, options=options)
        variants.append(variant)
    progress("convert", total, total, None)
    return variants


def _run_metrics(variants: list[ConvertedVariant]) -> dict[str, Any]:
    """The artifact's metrics: the largest verification errors, and per variant its graphs and node counts."""
    return {
        "variants": len(variants),
        "max_abs_error": max((v.max_abs_error for v in variants), default=0.0),
        "max_rel_error": max((v.max_rel_error for v in variants), default=0.0),
        "per_variant": {v.name: {"max_abs_error": v.to_json()["max_abs_error"],
                                 "max_rel_error": v.to_json()["max_rel_error"],
                                 "graphs": len(v.graphs),
                                 "nodes_before": v.to_json()["nodes_before"],
                                 "nodes_after": v.to_json()["nodes_after"]} for v in variants},
    }


def convert_model(
    source: ModelSource,
    out_dir: Path | str,
    *,
    options: ConvertOptions | None = None,
    onnx_input_shapes: tuple[tuple[int, ...], ...] | None = None,
    progress: ProgressCallback = no_progress,
    force: bool = False,
) -> ConvertResult:
    """Convert ``source`` into a verified "converted" artifact at ``out_dir`` (atomically)."""
    from hmt.artifacts.outputs import check_output_dir
    from hmt.convert.sources import source_inputs

    options = options or ConvertOptions()
    inputs = [p for p in (*source_inputs(source), options.data_path) if p]
    check_output_dir(out_dir, kind=CONVERTED_KIND, inputs=inputs, force=force)
    _check_options(options)
    config = _run_config(source, options, onnx_input_shapes, out_dir)
    parents: list[Artifact] = []
    variants: list[ConvertedVariant] = []
    notes: list[str] = []
    with ArtifactWriter(out_dir, kind=CONVERTED_KIND, config=config, parents=parents, inputs=inputs,
                        force=force) as writer:
        if isinstance(source, TorchSource):
            progress("convert", 0, 1, source.name)
            variants.append(_convert_torch(writer, source, options))
            progress("convert", 1, 1, source.name)
        elif isinstance(source, OnnxSource):
            progress("convert", 0, 1, source.name)
            variant, notes = _convert_onnx(writer, source, onnx_input_shapes, options=options)
            variants.append(variant)
            progress("convert", 1, 1, source.name)
        else:
            variants = _convert_supernet(writer, source, options, progress)
        report = {"variants": [v.to_json() for v in variants], "notes": notes}
        writer.write_json(REPORT_NAME, report)
        writer.metrics.update(_run_metrics(variants))
    return ConvertResult(Path(out_dir), tuple(variants), report)


def load_converted(path: Path | str) -> tuple[Artifact, dict[str, Any]]:
    """A verified "converted" artifact and its report."""
    from hmt.artifacts import load_artifact

    artifact = load_artifact(path, kind=CONVERTED_KIND)
    report = artifact.read_json(REPORT_NAME)
    if not isinstance(report, dict) or not isinstance(report.get("variants"), list):
        raise InputError(f"{artifact.root / REPORT_NAME}: malformed convert report")
    return artifact, report


__all__ = ["ConvertOptions", "ConvertResult", "ConvertedVariant", "convert_model", "load_converted", "op_counts"]
