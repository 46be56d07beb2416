"""One training step per phase of the recipe, and the parameter groups each phase trains."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hmt.supernet.calibrate import frozen_bn_statistics
from hmt.supernet.space import NOT_EXECUTED, WIDTH_KIND, ArchConfig, SearchSpace
from hmt.supernet.supernet import Supernet
from hmt.supernet.train.config import TrainConfig


def partition_parameters(net: Supernet, stages: range) -> list[nn.Parameter]:
    """Base (original-network) parameters of the given stages and their exits."""
    alt_ids = {id(p) for p in net.alternative_parameters()}
    params: list[nn.Parameter] = []
    if 0 in stages:
        params += list(net.stem.parameters())
    for s in stages:
        params += list(net.entries[s].parameters())
        for p_index in net._stage_positions(s):
            params += [p for p in net.blocks[p_index].parameters() if id(p) not in alt_ids]
        params += list(net.exits[s].parameters())
    return params


def freeze_earlier_partitions(net: Supernet, stage: int) -> None:
    """AdaScale Alg. 1 freeze mode: partitions before ``stage`` neither learn (their
    parameters are not optimised) nor move their BN running statistics (eval mode)."""
    net.stem.eval()
    for s in range(stage):
        net.entries[s].eval()
        for p in net._stage_positions(s):
            net.blocks[p].eval()
        net.exits[s].eval()


def exit_head_parameters(net: Supernet, stages: range) -> list[nn.Parameter]:
    """The early exits' heads of ``stages`` (the final head belongs to the original)."""
    last = len(net.exits) - 1
    return [p for s in stages if s != last for p in net.exits[s].parameters()]


def exit_arch(net: Supernet, exit_stage: int) -> ArchConfig:
    return net.space.make(["base"] * len(net.space.positions), exit_stage)


def step_supervised(
    net: Supernet, arch: ArchConfig, x: torch.Tensor, y: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    return F.cross_entropy(net(x, arch), y, label_smoothing=label_smoothing)


def _block_io(net: Supernet, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inputs and outputs of every block along the original network (the teacher)."""
    inputs, outputs = [], []
    h = net.stem(x)
    for s in range(net.space.num_stages):
        h = net.entries[s](h)
        for p in net._stage_positions(s):
            inputs.append(h)
            h = net.blocks[p](h, "base")
            outputs.append(h)
    return inputs, outputs


def step_distill(net: Supernet, x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """AdaptiveNet eq. 1: every block runs a randomly chosen alternative on the original
    network's input features and matches the original block's output (MSE); a merged
    block matches the output of the block after it. One random subnet per step."""
    was_training = net.training
    net.eval()
    with torch.no_grad():
        inputs, targets = _block_io(net, x)
    net.train(was_training)
    _freeze_base_statistics(net)
    losses = []
    for p, pos in enumerate(net.space.positions):
        if pos.kind == WIDTH_KIND:
            continue  # stream widths are learned in sandwich fine-tuning
        options = [c for c in pos.choices if c not in ("base", "skip")]
        if not options:
            continue
        choice = options[int(rng.integers(len(options)))]
        target = targets[p + 1] if choice == "merge" else targets[p]
        out = net.blocks[p](inputs[p], choice)
        losses.append(F.mse_loss(out.float(), target.float()))
    if not losses:
        return torch.zeros((), device=x.device, requires_grad=True)
    return torch.stack(losses).mean()


def _freeze_base_statistics(net: Supernet) -> None:
    # Alternatives share the block's shortcut; its BN statistics belong to the original
    # network and must not drift while the alternatives learn.
    for block in net.blocks:
        shortcut = getattr(block, "shortcut", None)
        if isinstance(shortcut, nn.Module):
            shortcut.eval()


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    t = temperature
    return (
        F.kl_div(F.log_softmax(student.float() / t, 1), F.softmax(teacher.float() / t, 1), reduction="batchmean")
        * t
        * t
    )


@dataclass(frozen=True)
class SubnetSampling:
    """Which subnets a sandwich step trains besides the largest: the smallest, then
    ``random_subnets`` random ones, ``structured_share`` of them width levels (``tied_share``
    of those with one level for stream and inner widths), with exits drawn over every stage
    (``uniform``) or the last two (``late``)."""

    random_subnets: int
    structured_share: float = 0.0
    exits: str = "uniform"
    tied_share: float = 0.0

    @classmethod
    def of(cls, config: TrainConfig) -> SubnetSampling:
        return cls(config.finetune_random_subnets, config.finetune_structured_share, config.finetune_exits,
                   config.finetune_tied_share)

    def exit_stage(self, space: SearchSpace, rng: np.random.Generator) -> int | None:
        if self.exits == "late":
            return space.num_stages - 1 - int(rng.integers(min(2, space.num_stages)))
        return None  # the space draws one uniformly

    def draw(self, space: SearchSpace, rng: np.random.Generator) -> ArchConfig:
        exit_stage = self.exit_stage(space, rng)
        # No extra draw when the share is 0, so runs of the plain recipe replay exactly.
        if self.structured_share > 0.0 and rng.random() < self.structured_share:
            tied = self.tied_share > 0.0 and rng.random() < self.tied_share
            return space.sample_structured(rng, exit_stage=exit_stage, tied=tied)
        return space.sample(rng, exit_stage=exit_stage)


def iter_finetune_archs(space: SearchSpace, rng: np.random.Generator, sampling: SubnetSampling
                        ) -> Iterator[ArchConfig]:
    """The sandwich rule: smallest, then the random subnets (the largest runs first, separately)."""
    yield space.smallest()
    for _ in range(sampling.random_subnets):
        yield sampling.draw(space, rng)


def step_finetune_frozen(
    net: Supernet,
    x: torch.Tensor,
    rng: np.random.Generator,
    *,
    sampling: SubnetSampling,
    exit_loss_weight: float,
    temperature: float,
) -> torch.Tensor:
    """Sandwich fine-tuning around a frozen original (in-place distillation, BigNAS-style):
    the original's logits teach its own early exits, the smallest subnet and
    the sampled ones. Calls backward itself, one graph at a time."""
    largest = net.space.largest()
    with torch.no_grad():
        feats = net.forward_stage_features(x, largest)
        teacher = net.exits[largest.exit_stage](feats[-1]).detach()
    total = torch.zeros((), device=x.device)
    if len(feats) > 1:
        # The early exits read the frozen trunk's features: only their heads learn here.
        exits_loss = torch.stack([kd_loss(net.exits[s](f), teacher, temperature) for s, f in enumerate(feats[:-1])])
        loss = exit_loss_weight * exits_loss.sum()
        loss.backward()
        total = total + loss.detach()
    for arch in iter_finetune_archs(net.space, rng, sampling):
        if all(c == NOT_EXECUTED for c in arch.choices) or arch == largest:
            continue
        with frozen_bn_statistics(net):
            sub_loss = kd_loss(net(x, arch), teacher, temperature)
        sub_loss.backward()
        total = total + sub_loss.detach()
    return total


def step_finetune(
    net: Supernet,
    x: torch.Tensor,
    y: torch.Tensor,
    rng: np.random.Generator,
    *,
    sampling: SubnetSampling,
    label_smoothing: float,
    exit_loss_weight: float,
    temperature: float,
) -> torch.Tensor:
    """Largest (labels, every exit) then smallest + random subnets distilled from the
    largest's final logits. Calls backward itself (one graph at a time keeps memory flat)."""
    largest = net.space.largest()
    logits = net.forward_exits(x, largest)
    loss = F.cross_entropy(logits[-1], y, label_smoothing=label_smoothing)
    for early in logits[:-1]:
        loss = loss + exit_loss_weight * F.cross_entropy(early, y, label_smoothing=label_smoothing)
    loss.backward()
    teacher = logits[-1].detach()
    total = loss.detach()
    for arch in iter_finetune_archs(net.space, rng, sampling):
        if all(c == NOT_EXECUTED for c in arch.choices):
            continue
        # Shared running statistics stay the largest network's; variants get their own
        # at materialisation (hmt.supernet.calibrate).
        with frozen_bn_statistics(net):
            sub_loss = kd_loss(net(x, arch), teacher, temperature)
        sub_loss.backward()
        total = total + sub_loss.detach()
    return total
