"""Specialization, Once-for-All's step after the search: fine-tune only the chosen variants' paths of
an elastified supernet, with the fine-tuning phase's losses (label-smoothed cross-entropy plus
distillation from the frozen original; the early exits' heads learn on detached features unless
``exits="joint"``), on the parent's own training split. Weight sharing spreads a supernet's steps
over every subnet; here every step goes to the variants that will be deployed. The original stays
exact (checked before writing) and the output is an ordinary supernet artifact whose
``variants.csv`` holds the largest variant and the specialized ones, re-evaluated (other variants
share weights with them and are not listed). Checkpoints between epochs make a killed run resume
where it stood."""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hmt.errors import ArtifactError, InputError, UsageError, VerificationError
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.elastify.selection import Choice, SpecializeRequest, select_variants
from hmt.supernet.space import ArchConfig
from hmt.supernet.train.config import TrainConfig

SPECIALIZE_REPORT = "specialize.json"
PHASE = "specialize"
SEED_WORD = 9  # the phase's seed word (elastification's phases use 1-8)
EXACT_ATOL = 1e-5  # as elastification: the largest variant against the original, max abs


@dataclass
class SpecializeResult:
    out_dir: Path
    metrics: dict[str, Any]
    variants: Any  # pandas DataFrame: the largest and the specialized variants, after
    before: Any  # the same variants in the parent, before


def parent_config(loaded: Any, request: SpecializeRequest) -> TrainConfig:
    """The parent's training config with the data found here and the request's overrides."""
    from hmt.artifacts.paths import resolve_recorded
    from hmt.supernet.train import resolve_config

    recorded = dict(loaded.artifact.manifest.config)
    data_path = request.data_path
    if data_path is None and recorded.get("data_path"):
        data_path = str(resolve_recorded(str(recorded["data_path"]), loaded.artifact.root))
    recorded.update({"data_path": data_path, "pretrained": None, "device": request.device,
                     "finetune_epochs": request.epochs})
    for key, value in (("batch_size", request.batch_size), ("max_train_samples", request.max_train_samples),
                       ("finetune_lr", request.lr), ("kd_temperature", request.kd_temperature)):
        if value is not None:
            recorded[key] = value
    try:
        return resolve_config(overrides=recorded)
    except (InputError, ValueError, TypeError) as exc:
        raise ArtifactError(f"{loaded.artifact.root}: its manifest's training config cannot be read ({exc})") from exc


def fingerprint(loaded: Any, config: TrainConfig, choices: list[Choice], request: SpecializeRequest,
                teachers: Sequence[dict[str, str]] = ()) -> str:
    """What a checkpoint must match to be resumed: the parent, the variants, the config, how the
    exits train, the training-order seed and the extra teachers' weights (joint exits, seed 0 and
    no extra teacher add nothing: checkpoints made before those options resume)."""
    text = json.dumps({"parent": loaded.artifact.manifest_sha256, "variants": [c.arch.arch_id for c in choices],
                       "config": config.fingerprint(),
                       **({} if request.exits == "joint" else {"exits": request.exits}),
                       **({"seed": request.seed} if request.seed else {}),
                       **({"teachers": [t["sha256"] for t in teachers]} if teachers else {})}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def specialize_supernet(
    parent: Path | str,
    out_dir: Path | str,
    request: SpecializeRequest,
    *,
    cache_dir: Path | None = None,
    checkpoint_dir: Path | None = None,
    restart: bool = False,
    keep_checkpoint: bool = False,
    force: bool = False,
    progress: ProgressCallback = no_progress,
    notify: Callable[[str], None] = lambda message: None,
    stop_after_epochs: int | None = None,
) -> SpecializeResult:
    """Fine-tune the requested variants of the elastified supernet at ``parent`` and write the
    specialized supernet to ``out_dir``. ``stop_after_epochs`` (tests) simulates a kill after
    that many epochs, checkpoint written."""
    import pandas as pd

    from hmt.supernet.artifact import VARIANTS, load_supernet
    from hmt.supernet.train import check_training_outputs, default_checkpoint_dir

    started = time.perf_counter()
    request = request.validate()
    out_dir = Path(out_dir)
    loaded = load_supernet(parent)
    if "elastify" not in loaded.model_info:
        raise InputError(f"{parent}: is a supernet trained from a preset; specialize works on elastified "
                         "supernets (train-supernet --model or --torchvision)")
    config = parent_config(loaded, request)
    checkpoint_dir = Path(checkpoint_dir or default_checkpoint_dir(out_dir))
    check_training_outputs(config, out_dir, checkpoint_dir, force=force, inputs=(str(parent),))
    table_path = Path(request.candidates) if request.candidates else loaded.artifact.file(VARIANTS)
    table = _read_table(table_path) if request.front_within is not None else pd.DataFrame()
    choices = select_variants(loaded.space, request, table, str(table_path))
    notify("specializing " + ", ".join(c.arch.arch_id for c in choices))
    teachers, teacher_records = load_teachers(loaded, request.teachers)
    if teachers:
        notify(f"distilling from the original and {len(teachers)} more teacher(s): "
               + ", ".join(f"{t['file']} ({t['sha256'][:12]})" for t in teacher_records))
    run = _Run(loaded, config, cache_dir, progress)
    check_trainable(run.net, choices)
    before = run.table(choices)
    reference = _largest_logits(run.net, config.seed)
    key = fingerprint(loaded, config, choices, request, teacher_records)
    history = run.train(choices, checkpoint_dir, key, request, run.place(teachers),
                        restart=restart, stop_after_epochs=stop_after_epochs, notify=notify)
    error = float((_largest_logits(run.net, config.seed) - reference).abs().max())
    if error > EXACT_ATOL:
        raise VerificationError(f"after specialization the largest variant differs from the original by {error:.3g} "
                                f"(max abs, > {EXACT_ATOL}); please report this model")
    after = run.table(choices)
    train_s = sum(h["epoch_s"] for h in history)
    metrics = {
        "parent_manifest_sha256": loaded.artifact.manifest_sha256,
        "specialized": [c.arch.arch_id for c in choices],
        "epochs": config.finetune_epochs,
        "lr": config.finetune_lr,
        "exits": request.exits,
        "kd_temperature": config.kd_temperature,
        "training_seed": request.seed,
        "teachers": teacher_records,
        "largest_vs_original_max_abs_after": error,
        "device": run.device_name(),
        "specialize_train_s": train_s,
        "wall_s": time.perf_counter() - started,
        **{f"{k}_{c.arch.arch_id}": v for c in choices for k, v in _accuracies(before, after, c.arch).items()},
    }
    report = {"parent": {"manifest_sha256": loaded.artifact.manifest_sha256, "kind": loaded.artifact.kind},
              "variants": [{**c.to_json_dict(), **_accuracies(before, after, c.arch)} for c in choices],
              "epochs": config.finetune_epochs, "lr": config.finetune_lr, "seed": config.seed,
              "losses": "label-smoothed cross-entropy + KD from the frozen original (+ early exits: "
                        "detached, their heads only, or joint), as elastification's fine-tuning phase"
                        + ("; the soft targets average the original's and the extra teachers' tempered softmaxes"
                           if teacher_records else ""),
              "teachers": teacher_records,
              "exits": request.exits, "kd_temperature": config.kd_temperature, "training_seed": request.seed,
              "candidates": table_path.name if request.front_within is not None else None,
              "exactness": {"atol": EXACT_ATOL, "after_training": error}}
    _write(out_dir, loaded, config, run, after, history, metrics, report, force=force)
    if not keep_checkpoint:
        from hmt.supernet.train.checkpoint import release_checkpoint_dir

        release_checkpoint_dir(checkpoint_dir)
    return SpecializeResult(out_dir=out_dir, metrics=metrics, variants=after, before=before)


def load_teachers(loaded: Any, paths: tuple[str, ...]) -> tuple[list[torch.nn.Module], list[dict[str, str]]]:
    """The original's architecture, rebuilt from the artifact's record, once per weight file
    (each loaded strictly: names and shapes must be the original's), frozen in eval mode; with
    each file's name and sha256 (what the report records: no path of this machine)."""
    if not paths:
        return [], []
    from hmt.supernet.elastify.rebuild import original_model
    from hmt.supernet.elastify.source import sha256_file

    info = loaded.model_info["elastify"]
    source = info.get("source")
    source_file = loaded.artifact.file(source) if source else None
    modules, records = [], []
    for text in paths:
        path = Path(text)
        if not path.is_file():
            raise InputError(f"--teacher-weights {path}: does not exist; expected a weights file (.safetensors, "
                             "or a torch state dict) for the supernet's original architecture")
        try:
            module = original_model(loaded.model_info, source_file, path)
        except InputError as exc:
            named = info["model"].get("torchvision") or info["model"].get("factory")
            hint = (f"; a teacher must be the original's own architecture ({named})"
                    if "do not fit the model" in str(exc) else "")
            raise InputError(f"--teacher-weights {exc}{hint}") from exc
        for p in module.parameters():
            p.requires_grad_(False)
        modules.append(module.eval())
        records.append({"file": path.name, "sha256": sha256_file(path)})
    return modules, records


def trainable_parameters(net: Any) -> list[torch.nn.Parameter]:
    """What specialization trains: the alternatives and the early exits (the original's blocks and
    its head stay frozen, so the largest variant stays exact)."""
    return list(net.elastic_parameters()) + [p for head in list(net.exits)[:-1] for p in head.parameters()]


def check_trainable(net: Any, choices: list[Choice]) -> None:
    """Refuse a variant whose output has nothing to learn: every block it runs is the original's
    (frozen, to keep the original exact) or skipped, and its exit is the original's head, so
    fine-tuning could not change what it computes (only early exits it does not use)."""
    x = torch.zeros(2, *net.space.input_shape, device=next(net.parameters()).device)
    was_training = net.training
    net.eval()
    try:
        for choice in choices:
            if not net.forward_exits(x, choice.arch)[-1].requires_grad:
                raise UsageError(f"{choice.arch.arch_id}: nothing on this variant's path can learn: each block "
                                 "it runs is the original's (frozen, so the original stays exact) or skipped; "
                                 "choose a variant with alternative blocks (w75, w50, ...) on its path")
    finally:
        net.train(was_training)


def _read_table(path: Path) -> Any:
    import pandas as pd

    try:
        return pd.read_csv(path)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: does not exist; expected a CSV of variants (variants.csv or a front CSV)") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV of variants ({exc})") from exc


def _accuracies(before: Any, after: Any, arch: ArchConfig) -> dict[str, float]:
    b = before[before.arch_id == arch.arch_id].iloc[0]
    a = after[after.arch_id == arch.arch_id].iloc[0]
    return {"val_acc_before": float(b.val_acc), "test_acc_before": float(b.test_acc),
            "val_acc": float(a.val_acc), "test_acc": float(a.test_acc)}


@torch.no_grad()
def _largest_logits(net: Any, seed: int) -> torch.Tensor:
    """The largest variant's logits on seeded random inputs, on the CPU in the original's memory
    format and eval mode (how elastification checks the original stays exact)."""
    cpu = copy.deepcopy(net).cpu().float().to(memory_format=torch.contiguous_format).eval()
    x = torch.randn(4, *net.space.input_shape, generator=torch.Generator().manual_seed(seed + 17))
    return cpu(x, net.space.largest()).float()


class _Run:
    """The parent's network on the training device with its data split rebuilt."""

    def __init__(self, loaded: Any, config: TrainConfig, cache_dir: Path | None, progress: ProgressCallback) -> None:
        from hmt.supernet.train.distributed import DistContext
        from hmt.supernet.train.trainer import _prepare_data, resolve_device

        self.loaded, self.config, self.progress = loaded, config, progress
        self.ctx = DistContext(rank=0, world_size=1, local_rank=0)
        self.device = resolve_device(config.device, self.ctx)
        data, self.train_split, self.val = _prepare_data(config, cache_dir, progress)
        recorded = loaded.dataset_info.get("source_sha256")
        if recorded and data.info.source_sha256 != recorded:
            raise InputError(f"{config.data_path or 'the embedded subset'}: data with sha256 "
                             f"{data.info.source_sha256[:12]}, the supernet was trained on {str(recorded)[:12]}; "
                             "pass --data with the data it was trained on (its training and validation split "
                             "are rebuilt from it)")
        self.data = data
        self.channels_last = self.device.type == "cuda" and data.info.modality == "image"
        self.autocast = self.device.type == "cuda" and config.amp
        self.net = loaded.net
        self.net.set_original_frozen(True)
        self.net.to(self.device)
        if self.channels_last:
            self.net.to(memory_format=torch.channels_last)

    def place(self, modules: list[torch.nn.Module]) -> list[torch.nn.Module]:
        """Modules on the training device, in its memory format."""
        placed = [m.to(self.device) for m in modules]
        return [m.to(memory_format=torch.channels_last) for m in placed] if self.channels_last else placed

    def device_name(self) -> str:
        return str(self.device) if self.device.type == "cpu" else torch.cuda.get_device_name(self.device)

    def evaluation(self, x: np.ndarray, y: np.ndarray | None) -> Any:
        from hmt.data import eval_loader

        return eval_loader(x, y, info=self.data.info, batch_size=self.config.eval_batch_size, device=self.device,
                           channels_last=self.channels_last)

    def table(self, choices: list[Choice]) -> Any:
        """The variant table (val and test accuracy per exit, costs) of the largest and ``choices``,
        each with BN statistics re-estimated on the parent's stored calibration images."""
        from hmt.supernet.train.report import variant_table

        variants = [("largest", self.net.space.largest())] + [("specialized", c.arch) for c in choices]
        calibration = self.loaded.calibration_batches(batch_size=self.config.eval_batch_size,
                                                      device=str(self.device))
        table = variant_table(self.net, variants, val_loader=self.evaluation(self.val.x, self.val.y),
                              test_loader=self.evaluation(self.data.test_x, self.data.test_y),
                              calibration=calibration, autocast=self.autocast, progress=self.progress)
        return table

    def train(self, choices: list[Choice], checkpoint_dir: Path, key: str, request: SpecializeRequest,
              teachers: list[torch.nn.Module], *, restart: bool, stop_after_epochs: int | None,
              notify: Callable[[str], None]) -> list[dict[str, Any]]:
        """Fine-tune the choices' paths; the request's seed varies the order of the training images
        and the sampling (0: the parent's), never the split."""
        from hmt.supernet.elastify.epochs import EpochResume, run_epochs, stop_if_requested_after_training, to_cpu
        from hmt.supernet.elastify.phases import finetune_step
        from hmt.supernet.elastify.train import _loader
        from hmt.supernet.train.checkpoint import open_checkpoint, resume_message, save_checkpoint
        from hmt.supernet.train.trainer import derive_seed

        net, config = self.net, self.config
        saved = open_checkpoint(checkpoint_dir, config_fingerprint=key, restart=restart) or {}
        history: list[dict[str, Any]] = list(saved.get("history", []))
        if saved:
            net.load_state_dict(saved["supernet"])
            notify(resume_message(checkpoint_dir, history, "trained" if saved.get("trained") else
                                  f"{PHASE} resumes at its epoch {int(saved.get('epoch', 0)) + 1}"))

        def save(phase: str, epoch: int, optimizer_state: dict[str, Any], trained: bool = False) -> None:
            save_checkpoint(checkpoint_dir, {"config_fingerprint": key, "history": history, "epoch": epoch,
                                             "optimizer": to_cpu(optimizer_state), "trained": trained,
                                             "supernet": {k: v.detach().cpu() for k, v in net.state_dict().items()}})

        if saved.get("trained"):
            return history
        seed = request.seed
        loader = _loader(self.train_split.x, self.train_split.y, self.data.info, config, self.device,
                         derive_seed(config.seed, 3, *([seed] if seed else [])), self.channels_last, self.ctx)
        params = trainable_parameters(net)
        resume = EpochResume(PHASE, int(saved.get("epoch", 0)), saved.get("optimizer"), save,
                             stop_after_epochs=stop_after_epochs)
        step = finetune_step(net, config, False, fixed=[c.arch for c in choices],
                             detach_exits=request.exits == "detached", teachers=teachers)
        net.train()
        run_epochs(PHASE, config.finetune_epochs, config.finetune_lr, params, step, loader, config, history,
                   self.progress, weight_decay=config.weight_decay, autocast=self.autocast, device=self.device,
                   seed_word=SEED_WORD + 1000 * seed, resume=resume)
        net.eval()
        save(PHASE, config.finetune_epochs, {}, trained=True)
        stop_if_requested_after_training()  # a Ctrl-C in the last epoch: stop before evaluation (resumable)
        return history


def _write(out_dir: Path, loaded: Any, config: TrainConfig, run: _Run, table: Any, history: list[dict[str, Any]],
           metrics: dict[str, Any], report: dict[str, Any], *, force: bool) -> None:
    from safetensors.torch import save_file

    from hmt.artifacts import ArtifactWriter
    from hmt.supernet.artifact import CALIBRATION, CURVES, HISTORY, MODEL, SPACE, VARIANTS, WEIGHTS, weights_for_file
    from hmt.supernet.elastify.train import ELASTIFY_REPORT
    from hmt.supernet.train.config import portable_config
    from hmt.supernet.train.report import plot_curves

    artifact = loaded.artifact
    config_json = portable_config(replace(config, device="auto").to_json_dict(), out_dir)
    config_json["extra"] = {**config_json.get("extra", {}),
                            "specialize": {"parent_manifest_sha256": artifact.manifest_sha256,
                                           "variants": metrics["specialized"], "epochs": config.finetune_epochs,
                                           "lr": config.finetune_lr}}
    listed = {record.path for record in artifact.manifest.files}
    source = loaded.model_info["elastify"].get("source")
    with ArtifactWriter(out_dir, kind=artifact.kind, config=config_json, parents=[artifact], force=force,
                        inputs=[p for p in (config.data_path,) if p]) as writer:
        state = weights_for_file(run.net)
        save_file(state, str(writer.path(WEIGHTS)))
        for name in (SPACE, MODEL, CALIBRATION, ELASTIFY_REPORT, source):
            if name and name in listed:  # copied as the parent has them
                writer.write_bytes(name, artifact.file(name).read_bytes())
        writer.write_json(SPECIALIZE_REPORT, report)
        table.to_csv(writer.path(VARIANTS), index=False)
        writer.write_json(HISTORY, history)
        plot_curves(history, writer.path(CURVES))
        writer.metrics.update(metrics)
