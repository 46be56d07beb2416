"""Per phase of the recipe: what it trains and how one of its steps runs (``phase_setup``),
and what each of its epochs evaluates (``phase_eval``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hmt.data import BatchLoader, batches_of
from hmt.errors import UsageError
from hmt.supernet.supernet import Supernet
from hmt.supernet.train.config import TrainConfig
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


def phase_setup(
    name: str, net: Supernet, config: TrainConfig
) -> tuple[list[torch.nn.Parameter], Callable[..., torch.Tensor]]:
    """The parameters phase ``name`` optimises, and its step: ``step(xb, yb, rng)`` runs the
    forward and backward passes of one batch and returns the loss."""
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


def phase_eval(
    name: str, net: Supernet, val_loader: BatchLoader, calib_loader: BatchLoader, autocast: bool
) -> dict[str, Any]:
    """What an epoch of phase ``name`` records about the network: validation accuracy at the
    exit a partition trains, else the largest network's (and after a fine-tuning epoch the
    smallest variant's too, recalibrated); nothing for distillation."""
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
