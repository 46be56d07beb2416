"""Train one architecture alone (its "standalone twin"), the baseline a supernet variant's
accuracy is judged against: same data, optimiser, schedule, augmentation and epochs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hmt.data import BatchLoader, Dataset, eval_loader, split_train_val
from hmt.supernet.space import ArchConfig
from hmt.supernet.supernet import VariantModule, build_supernet
from hmt.supernet.train.checkpoint import load_checkpoint, save_checkpoint
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.trainer import derive_seed, lr_at


@dataclass(frozen=True)
class StandaloneResult:
    arch_id: str
    epochs: int
    test_acc: float
    wall_s: float


def train_standalone(
    arch: ArchConfig,
    data: Dataset,
    config: TrainConfig,
    *,
    epochs: int,
    device: torch.device,
    lr: float,
    checkpoint_dir: Path | None = None,
) -> StandaloneResult:
    """Randomly initialise ``arch`` (same seed scheme as the supernet) and train its final exit
    with cross-entropy for ``epochs`` epochs on the supernet's training split. With
    ``checkpoint_dir`` a checkpoint is written after every epoch and a rerun resumes from it
    (a twin as long as a long supernet run outlasts one lease's command)."""
    started = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(config.seed, 10))
        net = build_supernet(
            config.backbone,
            num_classes=data.info.num_classes,
            input_shape=data.info.input_shape,
            operators=config.operators,
        )
    net.prepare_alternatives()
    model: VariantModule = net.materialize(net.space.parse(arch.arch_id))
    model.to(device).train()
    channels_last = device.type == "cuda" and data.info.modality == "image"
    if channels_last:
        model.to(memory_format=torch.channels_last)
    train, _ = split_train_val(data, config.val_fraction, np.random.default_rng(derive_seed(config.seed, 1)))
    if config.max_train_samples is not None and len(train.x) > config.max_train_samples:
        train = type(train)(train.x[: config.max_train_samples], train.y[: config.max_train_samples])
    loader = BatchLoader(
        train.x,
        train.y,
        info=data.info,
        batch_size=config.batch_size,
        device=device,
        augment=True,
        shuffle=True,
        generator=torch.Generator().manual_seed(derive_seed(config.seed, 3)),
        drop_last=True,
        channels_last=channels_last,
    )
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=config.momentum, nesterov=True, weight_decay=config.weight_decay
    )
    autocast = device.type == "cuda" and config.amp
    total = len(loader) * epochs
    fingerprint = f"{arch.arch_id}:{epochs}:{lr}:{config.fingerprint()}"
    start_epoch, step = _resume(checkpoint_dir, fingerprint, model, optimizer)
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)
        for xb, yb in loader:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(lr, step, total)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(model(xb), yb, label_smoothing=config.label_smoothing)
            loss.backward()
            optimizer.step()
            step += 1
        if checkpoint_dir is not None:
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
            save_checkpoint(checkpoint_dir, {
                "config_fingerprint": fingerprint, "epoch": epoch + 1, "step": step,
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            })
    return StandaloneResult(arch.arch_id, epochs, _test_accuracy(model, data, config, device, autocast),
                            time.perf_counter() - started)


def _resume(checkpoint_dir: Path | None, fingerprint: str, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(first epoch, step) to continue from: a checkpoint of this very run, or (0, 0)."""
    saved = load_checkpoint(checkpoint_dir, config_fingerprint=fingerprint) if checkpoint_dir else None
    if saved is None:
        return 0, 0
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["epoch"]), int(saved["step"])


def _test_accuracy(model: torch.nn.Module, data: Dataset, config: TrainConfig, device: torch.device,
                   autocast: bool) -> float:
    channels_last = device.type == "cuda" and data.info.modality == "image"
    model.eval()
    test = eval_loader(
        data.test_x,
        data.test_y,
        info=data.info,
        batch_size=config.eval_batch_size,
        device=device,
        channels_last=channels_last,
    )
    correct = seen = 0
    with torch.no_grad():
        for xb, yb in test:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
                correct += int((model(xb).argmax(1) == yb).sum())
            seen += len(yb)
    return correct / max(1, seen)
