"""Elastification end to end: load the user's model (kept exactly as the factory or
``--weights`` gives it; trained here first only when asked, ``train_original``), build the
supernet, train what was added, check the original stayed exact, write the
ordinary supernet artifact (plus the model source and an elastification report).

Recipe (AdaptiveNet 4.2, with early exits): the original is frozen; (1) the early exits
learn on the original's stage features; (2) branch-wise distillation: every alternative
matches the output of the block(s) it replaces, one random alternative per block and step
(eq. 1); (3) fine-tuning: the smallest and random subnets learn from labels and from the
original's logits. ``finetune_original`` also trains the original path in (3).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hmt.data import BatchLoader
from hmt.errors import UsageError, VerificationError
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.elastify.epochs import ELASTIC_PHASES, EpochResume, stop_if_requested_after_training, to_cpu
from hmt.supernet.elastify.evaluate import evaluate, table_metrics
from hmt.supernet.elastify.phases import train_elastic, train_original
from hmt.supernet.elastify.source import ModelSpec, build_model, check_rebuilds_alone, sha256_file
from hmt.supernet.elastify.supernet import ElastifiedSupernet, largest_error
from hmt.supernet.elastify.trace import copy_of, trace_model
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.distributed import DistContext

# The largest variant must reproduce the user's model to this max abs error (eval mode).
EXACT_ATOL = 1e-5
ELASTIFY_REPORT = "elastify.json"
SOURCE_COPY = "source.py"


@dataclass
class ElastifyResult:
    out_dir: Path
    metrics: dict[str, Any]
    variants: Any  # pandas DataFrame
    report: dict[str, Any]


def train_original_of(config: TrainConfig, spec: ModelSpec) -> bool:
    """Whether the original is trained here first (``--train-original``, for
    ``backbone_epochs``). Without the option the user's model is the original, exactly as
    given; a torchvision architecture without ``--weights`` has no trained weights to give,
    so it needs the option."""
    train_original = bool(config.extra.get("train_original", False))
    if train_original and config.backbone_epochs < 1:
        raise UsageError("--train-original needs --backbone-epochs >= 1 (the length of the original's training)")
    if not train_original and spec.torchvision is not None and spec.weights is None:
        raise UsageError(f"--torchvision {spec.torchvision} without --weights has untrained weights: give --weights "
                         "FILE, or --train-original to train it here first (--backbone-epochs epochs)")
    return train_original


def original_note(trained: bool, config: TrainConfig, spec: ModelSpec) -> str:
    """One line saying where the original's weights came from."""
    if trained:
        start = f"from --weights {Path(spec.weights).name}" if spec.weights else "from its initial weights"
        return f"trained here for {config.backbone_epochs} epoch(s) (--train-original, {start})"
    if spec.weights:
        return f"as given: --weights {Path(spec.weights).name}, unchanged"
    return f"as given: the model factory {spec.factory} returned, unchanged"


def spec_from_config(config: TrainConfig) -> ModelSpec:
    data = config.extra.get("elastify")
    if not isinstance(data, dict):
        raise UsageError("training config has no 'elastify' model (give --model or --torchvision)")
    return ModelSpec.from_json_dict(data).validate()


def _loader(x: np.ndarray, y: np.ndarray, info: Any, config: TrainConfig, device: torch.device, seed: int,
            channels_last: bool, ctx: DistContext) -> BatchLoader:
    """Training batches; under torchrun each rank draws its own share (``batch_size`` per rank)."""
    return BatchLoader(x, y, info=info, batch_size=config.batch_size, device=device, augment=True, shuffle=True,
                       generator=torch.Generator().manual_seed(seed),
                       drop_last=len(x) >= 2 * config.batch_size * ctx.world_size, channels_last=channels_last,
                       rank=ctx.rank, world_size=ctx.world_size)


@torch.no_grad()
def _check_output(model: nn.Module, spec: ModelSpec, num_classes: int) -> None:
    shape_text = ",".join(map(str, spec.input_shape))  # as typed
    try:
        out = model.eval()(torch.zeros(*spec.input_shape))
    except Exception as exc:  # whatever the user's forward raises, say what and where
        raise UsageError(f"the model fails on an input of --input-shape {shape_text} "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from exc
    expected = f"({spec.input_shape[0]}, {num_classes}) logits for the dataset's {num_classes} classes"
    if isinstance(out, torch.Tensor) and out.shape == (spec.input_shape[0], num_classes):
        _check_logits(model, spec)
        return
    if isinstance(out, torch.Tensor):
        raise UsageError(f"the model returns {tuple(out.shape)} for --input-shape {shape_text}; expected {expected}")
    what = type(out).__name__
    if isinstance(out, dict):
        what += f" (keys {', '.join(repr(k) for k in list(out)[:5])})"
    raise UsageError(f"the model returns a {what} for --input-shape {shape_text}; expected one tensor of {expected}: "
                     "wrap it in a module whose forward returns only the logits (e.g. model(x)['logits'] or "
                     "model(x)[0])")


def _check_logits(model: nn.Module, spec: ModelSpec) -> None:
    """Refuse a model that ends in a softmax: its outputs are probabilities, and hmt takes them for
    logits (cross-entropy in training, softmax confidence for early exits in serve)."""
    generator = torch.Generator().manual_seed(0)
    out = model(torch.randn(4, *spec.input_shape[1:], generator=generator))
    if isinstance(out, torch.Tensor) and bool((out >= 0).all()) and torch.allclose(out.sum(dim=1), torch.ones(4),
                                                                                      atol=1e-4, rtol=0):
        raise UsageError("the model's outputs are probabilities (each row is >= 0 and sums to 1: it ends in a "
                         "softmax); hmt takes logits (cross-entropy in training, softmax confidence for early exits): "
                         "return the scores before the softmax (a log_softmax is fine)")


def _check_data(spec: ModelSpec, info: Any) -> None:
    wants = "image" if len(spec.input_shape) == 4 else "sequence"
    shape_text = ",".join(map(str, spec.input_shape))  # as typed
    if info.modality != wants:
        raise UsageError(f"--input-shape {shape_text} is for {wants} data, dataset {info.name!r} is {info.modality}")
    if tuple(spec.input_shape[1:]) != tuple(info.input_shape):
        raise UsageError(f"--input-shape {shape_text} does not match dataset "
                         f"{info.name!r} samples of shape {tuple(info.input_shape)} (plus the batch)")


def _provenance(spec: ModelSpec) -> dict[str, Any]:
    """What the manifest records about the model: source sha256, factory, weights sha256."""
    out: dict[str, Any] = {"factory": spec.factory, "torchvision": spec.torchvision}
    if spec.file is not None:
        out["source_file"] = Path(spec.file).name  # by name and sha256: no path of this machine
        out["source_sha256"] = sha256_file(spec.file)
    if spec.torchvision is not None:
        from hmt.supernet.elastify.source import import_torchvision

        out["torchvision_version"] = str(import_torchvision().__version__)
    out["weights_file"] = Path(spec.weights).name if spec.weights else None
    out["weights_sha256"] = sha256_file(spec.weights) if spec.weights else None
    return out


class _Checkpoint:
    """Saves elastification's resumable state: the phases done, the history, the original's
    weights and, once built, the supernet's (``within``: a phase stopped between two of its
    epochs). Only the main rank writes: every rank holds the same weights."""

    def __init__(self, directory: Path, fingerprint: str, done: list[str], history: list[dict[str, Any]],
                 original_state: dict[str, torch.Tensor], is_main: bool) -> None:
        self.directory, self.fingerprint, self.is_main = directory, fingerprint, is_main
        self.done, self.history, self.original_state = done, history, original_state

    def __call__(self, net_state: dict[str, torch.Tensor] | None, within: dict[str, Any] | None = None) -> None:
        if not self.is_main:
            return
        from hmt.supernet.train.checkpoint import save_checkpoint

        state: dict[str, Any] = {"config_fingerprint": self.fingerprint, "phases": self.done,
                                 "history": self.history, "original": self.original_state}
        if net_state is not None:
            state["supernet"] = {k: v.detach().cpu() for k, v in net_state.items()}
        if within is not None:
            state["within_phase"] = within
        save_checkpoint(self.directory, state)


def elastify_supernet(
    config: TrainConfig,
    out_dir: Path,
    *,
    cache_dir: Path | None = None,
    progress: ProgressCallback = no_progress,
    checkpoint_dir: Path | None = None,
    restart: bool = False,
    keep_checkpoint: bool = False,
    force: bool = False,
    notify: Callable[[str], None] = lambda message: None,
    stop_after_epochs: int | None = None,
) -> ElastifyResult | None:
    """Elastify ``config.extra['elastify']``'s model on ``config.dataset`` and write the
    supernet artifact to ``out_dir`` (atomically). A checkpoint after every phase and every two
    minutes within one (in ``checkpoint_dir``, default OUT.ckpt) lets a killed run resume where it
    stood. ``stop_after_epochs`` (tests) simulates a kill after that many epochs, checkpoint written."""
    from hmt.data import eval_loader
    from hmt.supernet.train import check_training_outputs, default_checkpoint_dir
    from hmt.supernet.train.checkpoint import release_checkpoint_dir
    from hmt.supernet.train.distributed import init_distributed
    from hmt.supernet.train.trainer import _prepare_data, derive_seed, resolve_device

    started = time.perf_counter()
    spec = spec_from_config(config)
    spec.check_files()
    checkpoint_dir = Path(checkpoint_dir or default_checkpoint_dir(Path(out_dir)))
    check_training_outputs(config, Path(out_dir), checkpoint_dir, force=force, inputs=(spec.file, spec.weights))
    trained_original = train_original_of(config, spec)
    finetune_original = bool(config.extra.get("finetune_original", False))
    cuda = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
    ctx = init_distributed("cuda" if cuda else "cpu")  # torchrun: one process per GPU, gradients averaged
    device = resolve_device(config.device, ctx)
    data, train, val = _prepare_data(config, cache_dir, progress)
    _check_data(spec, data.info)
    provenance = {**_provenance(spec), "original_trained_here": trained_original,
                  "original_weights": original_note(trained_original, config, spec)}
    model = _user_model(spec, config, data.info.num_classes)
    channels_last = device.type == "cuda" and data.info.modality == "image"
    autocast = device.type == "cuda" and config.amp
    loader = _loader(train.x, train.y, data.info, config, device, derive_seed(config.seed, 3), channels_last, ctx)

    def evaluation(x: np.ndarray, y: np.ndarray | None) -> BatchLoader:
        return eval_loader(x, y, info=data.info, batch_size=config.eval_batch_size, device=device,
                           channels_last=channels_last)

    saved, history, original_state = _restore_original(model, loader, config, checkpoint_dir, restart, trained_original,
                                                       progress, autocast, device, ctx, notify)
    done: list[str] = sorted(set(saved.get("phases", [])) | {"original"})

    checkpoint = _Checkpoint(checkpoint_dir, config.fingerprint(), done, history, original_state, ctx.is_main)
    if "supernet" not in saved:
        checkpoint(None)
    net, analysis_s, error_before = _build_supernet(model, spec, config, data.info, finetune_original,
                                                    saved.get("supernet"), device, channels_last, ctx)
    for line in space_notes(net, config.operators):
        notify(line)
    train_start = time.perf_counter()

    def phase_done(name: str) -> None:
        done.append(name)
        checkpoint(net.state_dict())

    def epoch_saved(phase: str, epoch: int, optimizer_state: dict[str, Any]) -> None:
        checkpoint(net.state_dict(), {"phase": phase, "epoch": epoch, "optimizer": to_cpu(optimizer_state)})

    resumes = _resumes(saved.get("within_phase") or {}, epoch_saved, stop_after_epochs)
    train_elastic(net, loader, config, history, progress, autocast, device, finetune_original, set(done), phase_done,
                   resumes, ctx)
    stop_if_requested_after_training()  # a Ctrl-C in the last phase's last epoch: its checkpoint is written
    if not ctx.is_main:
        return None  # rank 0 evaluates and writes the artifact
    train_s = time.perf_counter() - train_start
    result = _evaluate_and_write(net, model, spec, config, data, train.x, val, evaluation, history, out_dir,
                                 provenance=provenance, trained_original=trained_original,
                                 finetune_original=finetune_original, error_before=error_before,
                                 timings={"started": started, "analysis_s": analysis_s, "train_s": train_s},
                                 device=device, channels_last=channels_last, autocast=autocast, progress=progress,
                                 force=force)
    if not keep_checkpoint:
        release_checkpoint_dir(checkpoint_dir)
    return result


def _restore_original(model: nn.Module, loader: BatchLoader, config: TrainConfig, checkpoint_dir: Path, restart: bool,
                      trained_original: bool, progress: ProgressCallback, autocast: bool, device: torch.device,
                      ctx: DistContext, notify: Callable[[str], None]
                      ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, torch.Tensor]]:
    """(the checkpoint read, or {}; the training history so far; the original's weights on the CPU):
    the original as the checkpoint kept it, else trained here when asked (``trained_original``),
    else the user's weights as given."""
    from hmt.supernet.train.checkpoint import open_checkpoint, resume_message

    saved = open_checkpoint(checkpoint_dir, config_fingerprint=config.fingerprint(), restart=restart) or {}
    if saved:
        within_note = (f"; {saved['within_phase']['phase']} resumes at its epoch {saved['within_phase']['epoch'] + 1}"
                       if saved.get("within_phase") else "")
        notify(resume_message(checkpoint_dir, saved.get("history", []),
                              "done: " + ", ".join(saved.get("phases", [])) + within_note))
    history: list[dict[str, Any]] = list(saved.get("history", []))
    if "original" in saved:
        model.load_state_dict(saved["original"])
    elif trained_original:
        model.to(device)
        train_original(model, loader, config, history, progress, autocast, device, ctx)
    model.cpu().float().eval()
    return saved, history, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def space_notes(net: ElastifiedSupernet, operators: Any) -> list[str]:
    """What the user asked for and did not get, said before training: no block with an
    alternative (the variants are the early exits alone), stream widths not offered."""
    notes = []
    if not any(len(p.choices) > 1 for p in net.space.positions):
        why = next((f" ({r.name} {key}: {text})" for r in net.reports for key, text in r.notes.items()), "")
        notes.append(f"note: no block got an alternative from the operators offered{why}; the variants are the "
                     f"{net.space.num_stages} early exits alone (every block's reasons: elastify.json)")
    asked = [o for o in (operators or ()) if str(o).startswith("sw")]
    if asked and net.stream is None:
        notes.append(f"note: {','.join(asked)} not offered: {net.stream_note}")
    return notes


def _build_supernet(model: nn.Module, spec: ModelSpec, config: TrainConfig, info: Any,
                    finetune_original: bool, saved_state: dict[str, torch.Tensor] | None, device: torch.device,
                    channels_last: bool, ctx: DistContext) -> tuple[ElastifiedSupernet, float, float]:
    """(the supernet on ``device``, from the checkpoint's weights when there are some; seconds the
    model's analysis took; the largest variant's max abs difference from the original)."""
    from hmt.supernet.train.distributed import broadcast_state
    from hmt.supernet.train.trainer import derive_seed

    analysis_start = time.perf_counter()
    net = ElastifiedSupernet(copy.deepcopy(model), name=spec.torchvision or str(spec.factory),
                             input_shape=tuple(spec.input_shape[1:]), leaves=spec.leaves,
                             operators=config.operators, seed=derive_seed(config.seed, 8))
    analysis_s = time.perf_counter() - analysis_start
    if len(net.space.positions) and net.space.num_classes != info.num_classes:
        raise UsageError(f"the model predicts {net.space.num_classes} classes, dataset {info.name!r} has "
                         f"{info.num_classes}")
    error_before = _check_largest(net, model, seed=config.seed, when="before training")
    net.set_original_frozen(not finetune_original)
    if saved_state is not None:
        net.load_state_dict(saved_state)
    net.to(device)
    if channels_last:
        net.to(memory_format=torch.channels_last)
    broadcast_state(net, ctx)
    return net, analysis_s, error_before


def _evaluate_and_write(net: ElastifiedSupernet, model: nn.Module, spec: ModelSpec, config: TrainConfig, data: Any,
                        train_x: np.ndarray, val: Any,
                        evaluation: Callable[[np.ndarray, np.ndarray | None], BatchLoader],
                        history: list[dict[str, Any]], out_dir: Path, *, provenance: dict[str, Any],
                        trained_original: bool, finetune_original: bool, error_before: float,
                        timings: dict[str, float], device: torch.device, channels_last: bool, autocast: bool,
                        progress: ProgressCallback, force: bool) -> ElastifyResult:
    """The trained supernet checked against the original again, its variants evaluated, the artifact written."""
    from hmt.supernet.train.trainer import calibration_subset

    net.eval()
    error_after = _check_largest(net, model, seed=config.seed + 1, when="after training")
    calibration_x = calibration_subset(train_x, config)
    original_test_acc, table = evaluate(net, model, evaluation, (val.x, val.y), (data.test_x, data.test_y),
                                         calibration_x, config, channels_last=channels_last, autocast=autocast,
                                         progress=progress)
    analysis_s, train_s = timings["analysis_s"], timings["train_s"]
    metrics = {
        **_run_metrics(device, provenance, timings["started"]),
        **table_metrics(table),
        "original_test_acc": original_test_acc,
        "largest_vs_original_max_abs_before": error_before,
        "largest_vs_original_max_abs_after": error_after,
        "original_trained_here": trained_original,
        "original_weights": original_note(trained_original, config, spec),
        "finetune_original": finetune_original,
        "variants_evaluated": len(table),
        "space_size": net.space.size(),
        "blocks": len(net.space.block_positions()),
        "blocks_kept_unchanged": net.report()["blocks_kept"],
        "analysis_s": analysis_s,
        "elastic_train_s": train_s,
        "elastify_s": analysis_s + train_s,
    }
    report = {**net.report(), "provenance": provenance, "exactness": {
        "atol": EXACT_ATOL, "before_training": error_before, "after_training": error_after}}
    _write(out_dir, config, net, spec, data, table, calibration_x, history, metrics, report, force=force)
    return ElastifyResult(out_dir=out_dir, metrics=metrics, variants=table, report=report)


def _run_metrics(device: torch.device, provenance: dict[str, Any], started: float) -> dict[str, Any]:
    return {"wall_s": time.perf_counter() - started,
            "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
            **{k: v for k, v in provenance.items() if k.endswith("sha256") or k == "factory"}}


def _resumes(within: dict[str, Any], save: Callable[[str, int, dict[str, Any]], None],
             stop_after_epochs: int | None) -> dict[str, EpochResume]:
    """Each phase's resume point: the checkpoint's epoch for the phase it stopped inside, else 0."""
    ran = [0]  # epochs of this invocation, over every phase
    return {name: EpochResume(name, int(within.get("epoch", 0)) if within.get("phase") == name else 0,
                              within.get("optimizer") if within.get("phase") == name else None, save,
                              stop_after_epochs=stop_after_epochs, ran=ran)
            for name in ELASTIC_PHASES}


def _check_largest(net: ElastifiedSupernet, model: nn.Module, *, seed: int, when: str) -> float:
    """Max abs error of the largest variant against the original, on the CPU in the original's
    memory format (where a GPU run's channels_last copy would take another conv path)."""
    cpu_net = copy.deepcopy(net).cpu().float().to(memory_format=torch.contiguous_format)
    error = largest_error(cpu_net, model.cpu().float(), seed=seed)
    if error > EXACT_ATOL and (when == "before training" or cpu_net.original_frozen):
        raise VerificationError(f"{when}, the largest variant differs from the original model by {error:.3g} "
                                f"(max abs, eval mode, > {EXACT_ATOL}); please report this model")
    return error


def _user_model(spec: ModelSpec, config: TrainConfig, num_classes: int) -> nn.Module:
    """The user's model, refused now (before any training) if it cannot be traced or does
    not give one logit per class of the dataset."""
    from dataclasses import replace

    from hmt.supernet.train.trainer import derive_seed

    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(config.seed, 0))  # the user's model's own initialisation
        model = build_model(spec if spec.torchvision is None else replace(spec, num_classes=num_classes))
    trace_model(copy_of(model), spec.leaves)
    _check_output(model, spec, num_classes)
    check_rebuilds_alone(spec, model, copy_name=SOURCE_COPY)
    _check_priced(model, spec)
    return model


def _check_priced(model: nn.Module, spec: ModelSpec) -> None:
    """Every later stage prices the variants layer by layer (profile-device, pareto): refuse
    now, before training, a layer with parameters that has no cost model."""
    from hmt.errors import ModelError
    from hmt.profile.features import layer_features

    try:
        layer_features(copy.deepcopy(model).eval(), spec.input_shape[1:])
    except ModelError as exc:
        raise ModelError(f"cannot elastify: {exc} (later stages price every variant layer by layer)") from exc


def _write(out_dir: Path, config: TrainConfig, net: ElastifiedSupernet, spec: ModelSpec, data: Any, table: Any,
           calibration_x: np.ndarray, history: list[dict[str, Any]], metrics: dict[str, Any],
           report: dict[str, Any], *, force: bool = False) -> None:
    from safetensors.torch import save_file

    from hmt.artifacts import ArtifactWriter
    from hmt.supernet.artifact import (
        CALIBRATION,
        CURVES,
        HISTORY,
        KIND,
        MODEL,
        SPACE,
        VARIANTS,
        WEIGHTS,
        weights_for_file,
    )
    from hmt.supernet.train.report import plot_curves

    model_info = {
        "backbone": net.space.backbone,
        "num_classes": net.space.num_classes,
        "input_shape": list(net.space.input_shape),
        "operators": list(config.operators) if config.operators is not None else None,
        "dataset": data.info.to_artifact_dict(),
        "elastify": {
            "model": {**spec.to_json_dict(), "num_classes": net.space.num_classes, "weights": None,
                      "file": Path(spec.file).name if spec.file else None},
            "source": SOURCE_COPY if spec.file is not None else None,
        },
    }
    from hmt.supernet.train.config import portable_config

    config_json = portable_config(config.to_json_dict(), out_dir)
    config_json["extra"] = {**config_json.get("extra", {}), "provenance": report["provenance"]}
    with ArtifactWriter(Path(out_dir), kind=KIND, config=config_json, force=force,
                        inputs=[p for p in (config.data_path, config.pretrained, spec.file, spec.weights) if p]
                        ) as writer:
        state = weights_for_file(net)
        save_file(state, str(writer.path(WEIGHTS)))
        writer.write_json(SPACE, net.space.to_json_dict())
        writer.write_bytes(MODEL, json.dumps(model_info, indent=2, sort_keys=True).encode())
        if spec.file is not None:
            writer.write_bytes(SOURCE_COPY, Path(spec.file).read_bytes())
        writer.write_json(ELASTIFY_REPORT, report)
        table.to_csv(writer.path(VARIANTS), index=False)
        np.savez(writer.path(CALIBRATION), x=calibration_x)
        writer.write_json(HISTORY, history)
        plot_curves(history, writer.path(CURVES))
        writer.metrics.update(metrics)

