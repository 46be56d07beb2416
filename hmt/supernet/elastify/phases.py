"""The elastification's training phases: the original (only when asked), then the exits, the
per-block distillation (and its fresh-operator extra) and the sandwich fine-tuning, each a step
function run by :func:`hmt.supernet.elastify.epochs.run_epochs`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hmt.data import BatchLoader
from hmt.errors import ModelError
from hmt.progress import ProgressCallback
from hmt.supernet.elastify.distill import FRESH
from hmt.supernet.elastify.epochs import EpochResume, run_epochs
from hmt.supernet.elastify.supernet import ElastifiedSupernet
from hmt.supernet.space import ArchConfig
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.distributed import DistContext


def train_original(model: nn.Module, loader: BatchLoader, config: TrainConfig, history: list[dict[str, Any]],
                    progress: ProgressCallback, autocast: bool, device: torch.device, ctx: DistContext) -> None:
    model.train()

    def step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        logits = model(xb)
        if not isinstance(logits, torch.Tensor):
            raise ModelError(
                f"--train-original: in training mode the model returns {type(logits).__name__}, not a tensor of "
                "logits (auxiliary outputs, as GoogLeNet's and Inception's have, are not trained here); train it "
                "yourself and give --weights, or make its training forward return the logits alone")
        loss = F.cross_entropy(logits, yb, label_smoothing=config.label_smoothing)
        loss.backward()
        return loss

    run_epochs("original", config.backbone_epochs, config.backbone_lr, list(model.parameters()), step, loader,
                config, history, progress, weight_decay=config.weight_decay, autocast=autocast, device=device,
                seed_word=1, ctx=ctx)
    model.eval()


def exit_step(net: ElastifiedSupernet, config: TrainConfig) -> Callable[..., torch.Tensor]:
    largest = net.space.largest()

    def step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        with torch.no_grad():
            feats = net.forward_stage_features(xb, largest)
        losses = [F.cross_entropy(net.exits[s](f), yb, label_smoothing=config.label_smoothing)
                  for s, f in enumerate(feats[:-1])]
        loss = torch.stack(losses).sum() if losses else torch.zeros((), device=xb.device, requires_grad=True)
        loss.backward()
        return loss

    return step


def finetune_step(
    net: ElastifiedSupernet, config: TrainConfig, finetune_original: bool,
    fixed: Sequence[ArchConfig] | None = None, detach_exits: bool = False,
    teachers: Sequence[nn.Module] = (),
) -> Callable[..., torch.Tensor]:
    """One step of the sandwich fine-tuning: the original teaches (KD) the subnets of the
    sandwich rule, or, with ``fixed``, those architectures every step (specialization).
    ``detach_exits``: the early exits' losses train their heads only, not the blocks.
    ``teachers`` (frozen, eval mode) teach beside the original: the soft targets are the
    average of all their tempered softmaxes (:func:`ensemble_logits`)."""
    from hmt.supernet.train.phases import SubnetSampling, iter_finetune_archs, kd_loss

    sampling = SubnetSampling.of(config)
    space = net.space
    # With "late" exits the sandwich's lower bound leaves late too: the smallest subnet of
    # the exits a front is made of, not a stem-and-one-stage network no front keeps.
    late_smallest = space.smallest(space.num_stages - 1) if sampling.exits == "late" else None

    def archs(rng: np.random.Generator) -> Iterator[ArchConfig]:
        if fixed is not None:
            yield from fixed
            return
        for i, arch in enumerate(iter_finetune_archs(space, rng, sampling)):
            yield late_smallest if (i == 0 and late_smallest is not None) else arch

    def step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        largest = net.space.largest()
        if finetune_original:
            teacher_logits = net(xb, largest)
            loss = F.cross_entropy(teacher_logits, yb, label_smoothing=config.label_smoothing)
            loss.backward()
            teacher, total = teacher_logits.detach(), loss.detach()
        else:
            with torch.no_grad():
                teacher = net(xb, largest)
            total = torch.zeros((), device=xb.device)
        if teachers:
            with torch.no_grad():
                teacher = ensemble_logits([teacher, *(t(xb) for t in teachers)], config.kd_temperature)
        for arch in archs(rng):
            logits = net.forward_exits(xb, arch, detach_early=detach_exits)
            loss = F.cross_entropy(logits[-1], yb, label_smoothing=config.label_smoothing)
            loss = loss + kd_loss(logits[-1], teacher, config.kd_temperature)
            for early in logits[:-1]:
                loss = loss + config.exit_loss_weight * F.cross_entropy(early, yb)
            if not loss.requires_grad:
                # Only the frozen original ran (the largest, or its blocks and skips to its own
                # head): nothing to learn. Small spaces draw such subnets often.
                continue
            loss.backward()
            total = total + loss.detach()
        return total

    return step


def ensemble_logits(logits: Sequence[torch.Tensor], temperature: float) -> torch.Tensor:
    """Logits whose softmax at ``temperature`` is the mean of the given logits' softmaxes at it
    (Hinton et al.'s ensemble soft targets), so ``kd_loss`` distils from the ensemble."""
    t = temperature
    probs = torch.stack([F.softmax(z.float() / t, dim=1) for z in logits]).mean(0)
    return t * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))


def distill_step(net: ElastifiedSupernet, *, fresh_only: bool = False) -> Callable[..., torch.Tensor]:
    from hmt.supernet.elastify.distill import distill_loss

    def step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        loss = distill_loss(net, xb, rng, fresh_only=fresh_only)
        loss.backward()
        return loss

    return step


def train_elastic(net: ElastifiedSupernet, loader: BatchLoader, config: TrainConfig, history: list[dict[str, Any]],
                   progress: ProgressCallback, autocast: bool, device: torch.device, finetune_original: bool,
                   done: set[str], phase_done: Callable[[str], None],
                   resumes: dict[str, EpochResume] | None = None, ctx: DistContext | None = None) -> None:
    """The three phases in order, skipping those a checkpoint says are done."""
    exit_params = [p for head in list(net.exits)[:-1] for p in head.parameters()]
    block_alt_params = net.elastic_parameters()
    fresh_params = [p for b in net.blocks for c in FRESH if c in b.alts for p in b.alts[c].parameters()]
    params = block_alt_params + exit_params
    if finetune_original:
        params += list(net.base_parameters())
    # (name, seed word, epochs, lr, parameters, step, weight decay); the seed words keep
    # the draws of runs made before the fresh-operator phase existed.
    phases = [
        ("exits", 2, config.partition_epochs, config.partition_lr, exit_params, exit_step(net, config),
         config.weight_decay),
        ("distill", 3, config.distill_epochs, config.distill_lr, block_alt_params, distill_step(net), 0.0),
        # Operators that start from random weights (dws) need longer than those sliced
        # or factored from the original's: extra epochs that distill only them.
        ("distill_fresh", 7, config.distill_fresh_epochs, config.distill_lr, fresh_params,
         distill_step(net, fresh_only=True), 0.0),
        ("finetune", 4, config.finetune_epochs, config.finetune_lr, params,
         finetune_step(net, config, finetune_original), config.weight_decay),
    ]
    net.train()
    for name, word, epochs, lr, group, step, decay in phases:
        if name in done:
            continue
        run_epochs(name, epochs, lr, group, step, loader, config, history, progress, weight_decay=decay,
                    autocast=autocast, device=device, seed_word=word, resume=(resumes or {}).get(name), ctx=ctx)
        phase_done(name)
