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

from hmt.data import BatchLoader, Dataset, eval_loader, load_dataset, split_train_val
from hmt.errors import UsageError
from hmt.progress import ProgressCallback, no_progress
from hmt.supernet.calibrate import mixed
from hmt.supernet.supernet import Supernet, build_supernet
from hmt.supernet.train.checkpoint import claim_checkpoint_dir, open_checkpoint, resume_message, save_checkpoint
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.distributed import DistContext, all_reduce_gradients, barrier, broadcast_state, init_distributed
from hmt.supernet.train.evaluate import evaluate_exits
from hmt.supernet.train.phase_setup import phase_eval, phase_setup
from hmt.supernet.train.phases import exit_arch


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


def _init_device(config: TrainConfig) -> tuple[DistContext, torch.device]:
    """The process group (set up when launched by torchrun) and the device this rank trains on."""
    device_kind = (
        "cuda"
        if (config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available()))
        else "cpu"
    )
    ctx = init_distributed(device_kind)
    return ctx, resolve_device(config.device, ctx)


def _build_net(config: TrainConfig, data: Dataset) -> Supernet:
    """The supernet for ``data``'s inputs and classes, its initial weights drawn from the run's
    seed (or loaded from ``config.pretrained``)."""
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
    return net


def _resume(
    net: Supernet, checkpoint_dir: Path, config: TrainConfig, *, restart: bool, notify: Callable[[str], None]
) -> tuple[TrainingState, dict[str, Any] | None, dict[str, torch.Tensor] | None]:
    """Claim the checkpoint folder and load its checkpoint of this config into ``net``, if any;
    returns the training state, the optimizer state and the partition snapshot to go on from."""
    claim_checkpoint_dir(checkpoint_dir)
    saved = open_checkpoint(checkpoint_dir, config_fingerprint=config.fingerprint(), restart=restart)
    if saved is None:
        return TrainingState(), None, None
    net.load_state_dict(saved["model"])
    state = TrainingState(
        phase_index=int(saved["phase_index"]),
        epoch=int(saved["epoch"]),
        alternatives_prepared=bool(saved["alternatives_prepared"]),
        partition_acc=dict(saved["partition_acc"]),
        history=list(saved["history"]),
        throughput=dict(saved.get("throughput", {})),
    )
    notify(resume_message(checkpoint_dir, state.history, f"phase {state.phase_index + 1}, its epoch "
                                                         f"{state.epoch + 1}"))
    return state, saved.get("optimizer"), saved.get("partition_snapshot")


def _place_net(net: Supernet, device: torch.device, data: Dataset, ctx: DistContext) -> bool:
    """Move ``net`` to ``device`` (channels-last for images on CUDA; returns whether) and give
    every rank rank 0's weights."""
    net.to(device)
    channels_last = device.type == "cuda" and data.info.modality == "image"
    if channels_last:
        net.to(memory_format=torch.channels_last)
    broadcast_state(net, ctx)
    return channels_last


@dataclass
class _Loaders:
    """The training loader (this rank's shard, shuffled and augmented) and the evaluation ones."""

    train: BatchLoader
    val: BatchLoader
    calibration: BatchLoader  # the calibration subset, batched as every later stage batches it
    calibration_x: np.ndarray


def _make_loaders(
    config: TrainConfig, data: Dataset, train: Any, val: Any, device: torch.device, ctx: DistContext,
    channels_last: bool,
) -> _Loaders:
    """The run's loaders: training batches whose order and augmentation follow the seed, and
    the validation set and calibration subset in evaluation order."""
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
    return _Loaders(loader, val_loader, evaluation(mixed(calibration_x), None), calibration_x)


@dataclass
class _Run:
    """What every phase and epoch of one invocation shares."""

    config: TrainConfig
    net: Supernet
    device: torch.device
    ctx: DistContext
    loaders: _Loaders
    progress: ProgressCallback
    checkpoint_dir: Path
    stop_after_epochs: int | None
    epochs_run: int = 0  # epochs of this invocation so far

    @property
    def autocast(self) -> bool:
        return self.device.type == "cuda" and self.config.amp


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
    ctx, device = _init_device(config)
    data, train, val = _prepare_data(config, cache_dir, progress)
    net = _build_net(config, data)
    state, optimizer_state, snapshot = _resume(net, checkpoint_dir, config, restart=restart, notify=notify)
    channels_last = _place_net(net, device, data, ctx)
    loaders = _make_loaders(config, data, train, val, device, ctx, channels_last)
    run = _Run(config, net, device, ctx, loaders, progress, checkpoint_dir, stop_after_epochs)
    specs = build_phases(config, net.space.num_stages)
    for phase_index in range(state.phase_index, len(specs)):
        if phase_index > state.phase_index:
            state.phase_index, state.epoch = phase_index, 0
            optimizer_state = None
        snapshot = _train_phase(run, phase_index, specs[phase_index], state, optimizer_state, snapshot)
    if not state.alternatives_prepared:
        net.prepare_alternatives()
        state.alternatives_prepared = True
    state.phase_index = len(specs)
    net.eval()
    return TrainedSupernet(
        net, data, (val.x, val.y), loaders.calibration_x, state, device, time.perf_counter() - started, ctx
    )


def _train_phase(
    run: _Run,
    phase_index: int,
    spec: PhaseSpec,
    state: TrainingState,
    optimizer_state: dict[str, Any] | None,
    snapshot: dict[str, torch.Tensor] | None,
) -> dict[str, torch.Tensor] | None:
    """The phase's epochs from ``state.epoch`` on, each evaluated and checkpointed; returns the
    partition snapshot (update-if-better mode) the next checkpoint carries."""
    net, config = run.net, run.config
    if spec.name != "backbone" and not state.alternatives_prepared:
        # SVD and kernel initialisation use the trained original weights.
        net.prepare_alternatives()
        state.alternatives_prepared = True
    if spec.name != "backbone" and not config.finetune_original:
        net.freeze_original()  # the largest variant stays the user's network, exact
    if spec.epochs == 0:
        return snapshot
    params, step_fn = phase_setup(spec.name, net, config)
    if not params:
        return snapshot  # e.g. the last partition around a frozen original: its head is the original's
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
    while state.epoch < spec.epochs:
        record = _train_epoch(run, phase_index, spec, state.epoch, optimizer, params, step_fn)
        record.update(phase_eval(spec.name, net, run.loaders.val, run.loaders.calibration, run.autocast))
        state.history.append(record)
        state.epoch += 1
        if state.epoch == spec.epochs and spec.name.startswith("partition"):
            snapshot = _finish_partition(spec.name, net, run.loaders.val, state, config, snapshot, run.autocast)
        if run.ctx.is_main:
            save_checkpoint(run.checkpoint_dir, _checkpoint_state(net, optimizer, state, config, snapshot))
        barrier(run.ctx)
        run.epochs_run += 1
        if run.stop_after_epochs is not None and run.epochs_run >= run.stop_after_epochs:
            raise TrainingInterrupted(f"stopped after {run.epochs_run} epochs (checkpoint written)")
    return snapshot


def _train_epoch(
    run: _Run,
    phase_index: int,
    spec: PhaseSpec,
    epoch: int,
    optimizer: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    step_fn: Callable[..., torch.Tensor],
) -> dict[str, Any]:
    """One epoch of the phase over this rank's shard, its shuffling, subnet draws and dropout
    seeded by (seed, phase, epoch); returns its history record (loss and throughput)."""
    config, device, loader = run.config, run.device, run.loaders.train
    steps_per_epoch = len(loader)
    total_steps = steps_per_epoch * spec.epochs
    loader.set_epoch(derive_seed(phase_index, epoch))
    rng = np.random.default_rng(derive_seed(config.seed, 4, phase_index, epoch))
    run.net.train()
    loss_sum = torch.zeros((), device=device)
    epoch_start = time.perf_counter()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # Dropout draws from torch's global generator; scope it to this epoch's seed.
        torch.manual_seed(derive_seed(config.seed, 5, phase_index, epoch))
        for step, (xb, yb) in enumerate(loader):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(spec.lr, epoch * steps_per_epoch + step, total_steps)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=run.autocast):
                loss = step_fn(xb, yb, rng)
            all_reduce_gradients(params, run.ctx)
            optimizer.step()
            loss_sum += loss.detach()
            if step % 10 == 0 or step == steps_per_epoch - 1:
                run.progress(
                    spec.name,
                    epoch * steps_per_epoch + step + 1,
                    total_steps,
                    f"epoch {epoch + 1}/{spec.epochs}",
                )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    epoch_s = time.perf_counter() - epoch_start
    return {
        "phase": spec.name,
        "epoch": epoch,
        "train_loss": float(loss_sum) / max(1, steps_per_epoch),
        "epoch_s": epoch_s,
        "images_per_s": steps_per_epoch * config.batch_size * run.ctx.world_size / epoch_s,
    }


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
