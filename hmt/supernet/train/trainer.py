"""The training driver: phases in order, a checkpoint after every epoch, resume on rerun.

Recipe (the train-supernet stage): backbone -> multi-stage partitions (AdaScale Alg. 1)
-> branch-wise distillation (AdaptiveNet eq. 1) -> sampled-subnet fine-tuning.
Every random draw comes from generators seeded by (seed, phase, epoch), so a run resumed
at an epoch boundary repeats exactly what the uninterrupted run would have done.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hmt.data import BatchLoader, Dataset, batches_of, eval_loader, load_dataset, split_train_val
from hmt.errors import UsageError
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.calibrate import mixed
from hmt.supernet.supernet import Supernet, build_supernet
from hmt.supernet.train.checkpoint import claim_checkpoint_dir, open_checkpoint, resume_message, save_checkpoint
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.distributed import DistContext, all_reduce_gradients, barrier, broadcast_state, init_distributed
from hmt.supernet.train.evaluate import calibrated_variant, evaluate_exits, evaluate_variant
from hmt.supernet.train.phases import (
    SubnetSampling,
    exit_arch,
    exit_head_parameters,
    freeze_earlier_partitions,
    partition_parameters,
    step_distill,
    step_finetune,
    step_finetune_frozen,
    step_supervised,
)


class TrainingInterrupted(Exception):
    """Raised by ``stop_after_epochs`` (tests) to simulate a kill right after a checkpoint."""


@dataclass
class PhaseSpec:
    name: str
    epochs: int
    lr: float


@dataclass
class TrainingState:
    phase_index: int = 0
    epoch: int = 0  # next epoch to run within the phase
    alternatives_prepared: bool = False
    partition_acc: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    throughput: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainedSupernet:
    net: Supernet
    dataset: Dataset
    val: tuple[np.ndarray, np.ndarray]
    calibration_x: np.ndarray
    state: TrainingState
    device: torch.device
    wall_s: float
    ctx: DistContext


def derive_seed(*words: int) -> int:
    return int(np.random.SeedSequence([w & 0xFFFFFFFF for w in words]).generate_state(1)[0])


def resolve_device(name: str, ctx: DistContext) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r} requested but CUDA is not available here; use --device cpu")
        if ctx.enabled:
            return torch.device("cuda", ctx.local_rank)
    return torch.device(name)


def build_phases(config: TrainConfig, num_stages: int) -> list[PhaseSpec]:
    specs = [PhaseSpec("backbone", config.backbone_epochs, config.backbone_lr)]
    specs += [PhaseSpec(f"partition{i}", config.partition_epochs, config.partition_lr) for i in range(num_stages)]
    specs += [PhaseSpec("distill", config.distill_epochs, config.distill_lr)]
    specs += [PhaseSpec("finetune", config.finetune_epochs, config.finetune_lr)]
    return specs


def lr_at(base_lr: float, step: int, total_steps: int) -> float:
    """One-cycle shape: linear warm-up over the first 15%, then cosine decay to zero."""
    warm = max(1, int(0.15 * total_steps))
    if step < warm:
        return base_lr * (step + 1) / warm
    progress = (step - warm) / max(1, total_steps - warm)
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def calibration_subset(train_x: np.ndarray, config: TrainConfig) -> np.ndarray:
    """The training samples every variant's BN statistics are re-estimated on."""
    count = min(config.calibration_samples, len(train_x))
    pick = np.sort(np.random.default_rng(derive_seed(config.seed, 7)).permutation(len(train_x))[:count])
    return np.ascontiguousarray(train_x[pick])


def _prepare_data(config: TrainConfig, cache_dir: Path | None, progress: ProgressCallback) -> tuple[Dataset, Any, Any]:
    data = load_dataset(
        config.dataset, Path(config.data_path) if config.data_path else None, cache_dir=cache_dir, progress=progress
    )
    train, val = split_train_val(data, config.val_fraction, np.random.default_rng(derive_seed(config.seed, 1)))
    if config.max_train_samples is not None and len(train.x) > config.max_train_samples:
        keep = np.sort(
            np.random.default_rng(derive_seed(config.seed, 2)).permutation(len(train.x))[: config.max_train_samples]
        )
        train = type(train)(train.x[keep], train.y[keep])
    return data, train, val


def _check_modality(net_dims: int, data: Dataset, backbone: str) -> None:
    wants = "image" if net_dims == 2 else "sequence"
    if data.info.modality != wants:
        raise UsageError(
            f"backbone {backbone!r} takes {wants} inputs but dataset {data.info.name!r} gives {data.info.modality} data"
        )


def train_supernet_model(
    config: TrainConfig,
    *,
    checkpoint_dir: Path,
    restart: bool = False,
    cache_dir: Path | None = None,
    progress: ProgressCallback = no_progress,
    stop_after_epochs: int | None = None,
    notify: Callable[[str], None] = lambda message: None,
) -> TrainedSupernet:
    """Run (or resume) every phase; returns the trained network and what is needed to
    evaluate it. ``stop_after_epochs`` stops after that many epochs of this invocation,
    right after their checkpoint (for tests of resume)."""
    started = time.perf_counter()
    device_kind = (
        "cuda"
        if (config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available()))
        else "cpu"
    )
    ctx = init_distributed(device_kind)
    device = resolve_device(config.device, ctx)
    data, train, val = _prepare_data(config, cache_dir, progress)
    with torch.random.fork_rng():
        # Weight initialisation draws from torch's global generator; seed it in a scope.
        torch.manual_seed(derive_seed(config.seed, 0))
        net = build_supernet(
            config.backbone,
            num_classes=data.info.num_classes,
            input_shape=data.info.input_shape,
            operators=config.operators,
        )
    _check_modality(net.definition.dims, data, config.backbone)
    if config.pretrained:
        net.load_pretrained(Path(config.pretrained))
    state = TrainingState()
    claim_checkpoint_dir(checkpoint_dir)
    saved = open_checkpoint(checkpoint_dir, config_fingerprint=config.fingerprint(), restart=restart)
    optimizer_state = None
    if saved is not None:
        net.load_state_dict(saved["model"])
        state = TrainingState(
            phase_index=int(saved["phase_index"]),
            epoch=int(saved["epoch"]),
            alternatives_prepared=bool(saved["alternatives_prepared"]),
            partition_acc=dict(saved["partition_acc"]),
            history=list(saved["history"]),
            throughput=dict(saved.get("throughput", {})),
        )
        optimizer_state = saved.get("optimizer")
        snapshot = saved.get("partition_snapshot")
        notify(resume_message(checkpoint_dir, state.history, f"phase {state.phase_index + 1}, its epoch "
                                                             f"{state.epoch + 1}"))
    else:
        snapshot = None
    net.to(device)
    channels_last = device.type == "cuda" and data.info.modality == "image"
    if channels_last:
        net.to(memory_format=torch.channels_last)
    broadcast_state(net, ctx)
    gen = torch.Generator().manual_seed(derive_seed(config.seed, 3))
    loader = BatchLoader(
        train.x,
        train.y,
        info=data.info,
        batch_size=config.batch_size,
        device=device,
        augment=True,
        shuffle=True,
        generator=gen,
        drop_last=len(train.x) >= 2 * config.batch_size * ctx.world_size,
        channels_last=channels_last,
        rank=ctx.rank,
        world_size=ctx.world_size,
    )

    def evaluation(x: np.ndarray, y: np.ndarray | None) -> BatchLoader:
        return eval_loader(
            x, y, info=data.info, batch_size=config.eval_batch_size, device=device, channels_last=channels_last
        )

    val_loader = evaluation(val.x, val.y)
    calibration_x = calibration_subset(train.x, config)
    calib_loader = evaluation(mixed(calibration_x), None)  # batched as every later stage batches it
    autocast = device.type == "cuda" and config.amp
    specs = build_phases(config, net.space.num_stages)
    epochs_run = 0
    for phase_index in range(state.phase_index, len(specs)):
        spec = specs[phase_index]
        if phase_index > state.phase_index:
            state.phase_index, state.epoch = phase_index, 0
            optimizer_state = None
        if spec.name != "backbone" and not state.alternatives_prepared:
            # SVD and kernel initialisation use the trained original weights.
            net.prepare_alternatives()
            state.alternatives_prepared = True
        if spec.name != "backbone" and not config.finetune_original:
            net.freeze_original()  # the largest variant stays the user's network, exact
        if spec.epochs == 0:
            continue
        params, step_fn = _phase_setup(spec.name, net, config)
        if not params:
            continue  # e.g. the last partition around a frozen original: its head is the original's
        if spec.name.startswith("partition") and config.partition_mode == "update-if-better" and state.epoch == 0:
            stage = int(spec.name.removeprefix("partition"))
            snapshot = {k: v.detach().clone().cpu() for k, v in _earlier_partition_state(net, stage).items()}
        optimizer = torch.optim.SGD(
            params,
            lr=spec.lr,
            momentum=config.momentum,
            nesterov=True,
            weight_decay=config.weight_decay if spec.name != "distill" else 0.0,
        )
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
            optimizer_state = None
        steps_per_epoch = len(loader)
        total_steps = steps_per_epoch * spec.epochs
        while state.epoch < spec.epochs:
            epoch = state.epoch
            loader.set_epoch(derive_seed(phase_index, epoch))
            rng = np.random.default_rng(derive_seed(config.seed, 4, phase_index, epoch))
            net.train()
            loss_sum = torch.zeros((), device=device)
            epoch_start = time.perf_counter()
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                # Dropout draws from torch's global generator; scope it to this epoch's seed.
                torch.manual_seed(derive_seed(config.seed, 5, phase_index, epoch))
                for step, (xb, yb) in enumerate(loader):
                    for group in optimizer.param_groups:
                        group["lr"] = lr_at(spec.lr, epoch * steps_per_epoch + step, total_steps)
                    optimizer.zero_grad(set_to_none=True)
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
                        loss = step_fn(xb, yb, rng)
                    all_reduce_gradients(params, ctx)
                    optimizer.step()
                    loss_sum += loss.detach()
                    if step % 10 == 0 or step == steps_per_epoch - 1:
                        progress(
                            spec.name,
                            epoch * steps_per_epoch + step + 1,
                            total_steps,
                            f"epoch {epoch + 1}/{spec.epochs}",
                        )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            epoch_s = time.perf_counter() - epoch_start
            record: dict[str, Any] = {
                "phase": spec.name,
                "epoch": epoch,
                "train_loss": float(loss_sum) / max(1, steps_per_epoch),
                "epoch_s": epoch_s,
                "images_per_s": steps_per_epoch * config.batch_size * ctx.world_size / epoch_s,
            }
            record.update(_phase_eval(spec.name, net, val_loader, calib_loader, autocast))
            state.history.append(record)
            state.epoch += 1
            if state.epoch == spec.epochs and spec.name.startswith("partition"):
                snapshot = _finish_partition(spec.name, net, val_loader, state, config, snapshot, autocast)
            if ctx.is_main:
                save_checkpoint(checkpoint_dir, _checkpoint_state(net, optimizer, state, config, snapshot))
            barrier(ctx)
            epochs_run += 1
            if stop_after_epochs is not None and epochs_run >= stop_after_epochs:
                raise TrainingInterrupted(f"stopped after {epochs_run} epochs (checkpoint written)")
    if not state.alternatives_prepared:
        net.prepare_alternatives()
        state.alternatives_prepared = True
    state.phase_index = len(specs)
    net.eval()
    return TrainedSupernet(net, data, (val.x, val.y), calibration_x, state, device, time.perf_counter() - started, ctx)


def _phase_setup(
    name: str, net: Supernet, config: TrainConfig
) -> tuple[list[torch.nn.Parameter], Callable[..., torch.Tensor]]:
    if name == "backbone":
        largest = net.space.largest()
        params = list(net.base_parameters())
        # The early-exit heads are trained by the partition phases, not here.
        head_ids = {id(p) for s in range(net.space.num_stages - 1) for p in net.exits[s].parameters()}
        params = [p for p in params if id(p) not in head_ids]

        def backbone_step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
            loss = step_supervised(net, largest, xb, yb, config.label_smoothing)
            loss.backward()
            return loss

        return params, backbone_step
    if name.startswith("partition"):
        stage = int(name.removeprefix("partition"))
        stages = range(stage, stage + 1) if config.partition_mode == "freeze" else range(stage + 1)
        if config.finetune_original:
            params = partition_parameters(net, stages)
            if config.partition_mode == "update-if-better":
                params += [p for s in range(stage) for p in net.exits[s].parameters()]
        else:
            # The original is frozen: each partition trains its exit head on its features.
            params = exit_head_parameters(net, range(stage, stage + 1))
        arch = exit_arch(net, stage)
        freeze_earlier = config.partition_mode == "freeze"

        def partition_step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
            if freeze_earlier:
                freeze_earlier_partitions(net, stage)
            loss = step_supervised(net, arch, xb, yb, config.label_smoothing)
            if loss.requires_grad:
                loss.backward()
            return loss

        return list({id(p): p for p in params}.values()), partition_step
    if name == "distill":
        params = list(net.alternative_parameters())

        def distill_step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
            loss = step_distill(net, xb, rng)
            loss.backward()
            return loss

        return params, distill_step
    if name == "finetune" and not config.finetune_original:
        params = list(net.alternative_parameters()) + exit_head_parameters(net, range(net.space.num_stages))

        def frozen_finetune_step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
            return step_finetune_frozen(
                net,
                xb,
                rng,
                sampling=SubnetSampling.of(config),
                exit_loss_weight=config.exit_loss_weight,
                temperature=config.kd_temperature,
            )

        return params, frozen_finetune_step
    if name == "finetune":
        params = list(net.parameters())

        def finetune_step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
            return step_finetune(
                net,
                xb,
                yb,
                rng,
                sampling=SubnetSampling.of(config),
                label_smoothing=config.label_smoothing,
                exit_loss_weight=config.exit_loss_weight,
                temperature=config.kd_temperature,
            )

        return params, finetune_step
    raise UsageError(f"unknown phase {name!r}")


def _phase_eval(
    name: str, net: Supernet, val_loader: BatchLoader, calib_loader: BatchLoader, autocast: bool
) -> dict[str, Any]:
    if name == "distill":
        return {}
    if name.startswith("partition"):
        stage = int(name.removeprefix("partition"))
        acc = evaluate_exits(net, exit_arch(net, stage), val_loader, autocast=autocast)
        return {"val_acc": acc[-1], "exit": stage}
    largest = net.space.largest()
    acc = evaluate_exits(net, largest, val_loader, autocast=autocast)
    out: dict[str, Any] = {"val_acc": acc[-1], "exit": net.space.num_stages - 1}
    if name == "finetune":
        smallest = calibrated_variant(net, net.space.smallest(), batches_of(calib_loader))
        out["val_acc_smallest"] = evaluate_variant(smallest, val_loader, autocast=autocast)[-1]
    return out


def _earlier_partition_state(net: Supernet, stage: int) -> dict[str, torch.Tensor]:
    """State of partitions < stage: stem, their stages' blocks and their exits."""
    prefixes = ["stem."] + [f"entries.{s}." for s in range(stage)] + [f"exits.{s}." for s in range(stage)]
    prefixes += [f"blocks.{p}." for s in range(stage) for p in net._stage_positions(s)]
    return {k: v for k, v in net.state_dict().items() if any(k.startswith(pre) for pre in prefixes)}


def _finish_partition(
    name: str,
    net: Supernet,
    val_loader: BatchLoader,
    state: TrainingState,
    config: TrainConfig,
    snapshot: dict[str, torch.Tensor] | None,
    autocast: bool,
) -> dict[str, torch.Tensor] | None:
    """Record Acc_i; in update-if-better mode keep the earlier partitions' new weights only
    if the previous exit improved (AdaScale Algorithm 1, mode b), else restore them."""
    stage = int(name.removeprefix("partition"))
    if config.partition_mode == "update-if-better" and stage > 0 and snapshot is not None:
        previous = f"partition{stage - 1}"
        new_acc = evaluate_exits(net, exit_arch(net, stage - 1), val_loader, autocast=autocast)[-1]
        if previous in state.partition_acc and new_acc <= state.partition_acc[previous]:
            net.load_state_dict(snapshot, strict=False)
            state.history.append(
                {
                    "phase": name,
                    "event": "restored earlier partitions",
                    "exit": stage - 1,
                    "acc_new": new_acc,
                    "acc_kept": state.partition_acc[previous],
                }
            )
        else:
            state.partition_acc[previous] = new_acc
    state.partition_acc[name] = evaluate_exits(net, exit_arch(net, stage), val_loader, autocast=autocast)[-1]
    return None


def _checkpoint_state(
    net: Supernet,
    optimizer: torch.optim.Optimizer,
    state: TrainingState,
    config: TrainConfig,
    snapshot: dict[str, torch.Tensor] | None,
) -> dict[str, Any]:
    return {
        "config_fingerprint": config.fingerprint(),
        "model": {k: v.detach().cpu() for k, v in net.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "phase_index": state.phase_index,
        "epoch": state.epoch,
        "alternatives_prepared": state.alternatives_prepared,
        "partition_acc": state.partition_acc,
        "history": state.history,
        "throughput": state.throughput,
        "partition_snapshot": snapshot,
    }
