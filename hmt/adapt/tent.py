"""TENT (Wang et al., ICLR 2021): test-time entropy minimisation of the BN affine parameters.

Only the scale and shift of every batch-norm layer learn; BN layers normalise with the
statistics of the batch (train mode) while the rest of the network, dropout included,
stays in eval mode. The loss is the mean prediction entropy over the exits the variant
has (every exit decides at run time with early exit, so all of them should adapt; a
plain model has one). One ``step`` is one online batch: predict, then update, as in the
paper. ``adapted_variant`` returns the result as a new eval-mode module, its BN running
statistics re-estimated on the recent inputs with the final affine parameters.

The forward/backward/update runs through ``TrainingEngine``: plain autograd by default,
or with the memory-saving options (8-bit saved activations, recomputation under a
budget, updates inside the backward pass).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hmt.adapt.engine import EngineOptions, TrainingEngine
from hmt.errors import UsageError

OPTIMIZERS = ("adam", "sgd")


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-sample prediction entropy (nats) of a batch of logits."""
    log_p = torch.log_softmax(logits.float(), dim=1)
    return -(log_p.exp() * log_p).sum(dim=1)


def batch_norms(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm)]


def recalibrate_bn(model: nn.Module, batches: Iterable[torch.Tensor]) -> int:
    """Re-estimate every BN layer's statistics over ``batches`` (the torch reference of
    ``hmt.adapt.bn_runtime``): ``hmt.supernet.calibrate.recalibrate_bn`` without keeping the
    original network's statistics, because at test time it is exactly those that no longer
    fit (on the shipped ResNet-56's largest variant, where every block is the original's,
    re-estimating only the others left accuracy on every corruption unchanged)."""
    from hmt.supernet.calibrate import recalibrate_bn as calibrate

    return calibrate(model, batches, keep_original=False)


@dataclass(frozen=True)
class TentOptions:
    lr: float = 1e-3
    optimizer: str = "adam"
    momentum: float = 0.9  # SGD only
    exits: str = "all"  # "all": mean entropy over every exit; "last": the final exit only
    engine: EngineOptions = field(default_factory=lambda: EngineOptions(compress=False, update_in_backward=False))

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"TENT optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0.0 < self.lr <= 1.0:
            raise UsageError(f"TENT learning rate must be in (0, 1], got {self.lr}")
        if self.exits not in ("all", "last"):
            raise UsageError(f"TENT exits must be 'all' or 'last', got {self.exits!r}")


def configure_for_tent(model: nn.Module) -> list[nn.Parameter]:
    """Freeze everything but the BN affine parameters; BN layers use batch statistics and do
    not touch their running statistics (momentum 0). Returns the trainable parameters."""
    model.eval()
    model.requires_grad_(False)
    params: list[nn.Parameter] = []
    for m in batch_norms(model):
        m.train()
        m.momentum = 0.0
        for p in (m.weight, m.bias):
            if p is not None:
                p.requires_grad_(True)
                params.append(p)
    if not params:
        raise UsageError(f"{type(model).__name__}: has no batch-norm affine parameters for TENT to adapt")
    return params


@dataclass(frozen=True)
class TentStep:
    logits: torch.Tensor  # the last exit's logits of this batch, before the update
    entropy: float  # the loss of this batch (mean entropy over the chosen exits)


class TentAdapter:
    """Adapts a private copy of ``model``; the model passed in is never modified."""

    def __init__(self, model: nn.Module, options: TentOptions = TentOptions()) -> None:
        self.options = options
        self.source = model
        self.model = copy.deepcopy(model)
        self.params = configure_for_tent(self.model)

        def make_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
            if options.optimizer == "adam":
                return torch.optim.Adam(params, lr=options.lr, betas=(0.9, 0.999))
            return torch.optim.SGD(params, lr=options.lr, momentum=options.momentum)

        self.engine = TrainingEngine(self.model, self.params, make_optimizer, options.engine)
        self.steps = 0

    def _loss(self, logits: Sequence[torch.Tensor]) -> torch.Tensor:
        chosen = logits if self.options.exits == "all" else logits[-1:]
        return torch.stack([entropy(t).mean() for t in chosen]).mean()

    def step(self, x: torch.Tensor) -> TentStep:
        logits = self.engine.step(x, self._loss)
        self.steps += 1
        return TentStep(logits=logits[-1], entropy=float(self._loss(logits)))

    def adapted_variant(self, recent: Iterable[torch.Tensor]) -> nn.Module:
        """An eval-mode copy with the adapted affine parameters and BN statistics
        re-estimated on ``recent`` inputs: a new variant of the pool."""
        variant = copy.deepcopy(self.model)
        variant.requires_grad_(False)
        for m, src in zip(batch_norms(variant), batch_norms(self.source), strict=True):
            m.momentum = src.momentum
        recalibrate_bn(variant, recent)
        return variant.eval()

    def close(self) -> None:
        self.engine.close()
