"""Batch-norm statistics per variant.

Every subnet of a weight-sharing supernet passes different features through the same
blocks, so one set of running statistics cannot fit them all: measured on CIFAR-10 with
ResNet-18, evaluating with the shared statistics gave a median variant 29% accuracy, and
79% after re-estimating each variant's statistics on 21k training images (Once-for-All
does the same). hmt therefore (1) keeps the shared statistics the largest network's own
(subnets run with BN momentum 0 during fine-tuning), and (2) re-estimates a materialised
variant's statistics on a fixed calibration set stored in the supernet artifact, so any
stage that materialises a variant gets the same numbers without the dataset.

The calibration set is stored in dataset order, and datasets are often stored class by class
(the CIFAR-10 copy is), so batches cut from it in that order hold one or two classes each. BN's
re-estimate averages per-batch means and variances, so those batches miss the variance between
classes: measured on a width-0.5 ResNet-18 variant, 89.98 % test accuracy from class-ordered
batches of 256 against 90.63-90.72 % from any mixed 2048 training images. Every stage therefore
batches the stored samples in one fixed mixed order (:func:`mixed`), artifacts written before
this included.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

MIX_SEED = 0x5EED  # the one fixed order every stage batches the stored calibration samples in


def mixed(samples: np.ndarray) -> np.ndarray:
    """The stored calibration samples in the fixed mixed order every stage batches them in (the
    same order for the same samples, so accuracies agree from stage to stage)."""
    return np.ascontiguousarray(samples[np.random.default_rng(MIX_SEED).permutation(len(samples))])


def _norms(module: nn.Module) -> list[_BatchNorm]:
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


def calibrated_norms(module: nn.Module) -> list[_BatchNorm]:
    """The BN layers whose statistics a variant re-estimates: all but the original
    network's (marked by ``hmt.supernet.blocks.keep_statistics``), which ran with their
    trained statistics throughout training and so keep them."""
    return [m for m in _norms(module) if not getattr(m, "hmt_keep_statistics", False)]


def train_for_calibration(module: nn.Module) -> None:
    """Train mode (batch statistics) for the BN layers being re-estimated only; eval mode for
    the original network's, which keep theirs, and for everything else: a dropout (or
    stochastic depth) inside a block would otherwise drop features at random while the
    statistics after it are measured, so they would be biased and differ from one
    materialisation of the same variant to the next."""
    module.eval()
    for m in calibrated_norms(module):
        m.train()


@torch.no_grad()
def recalibrate_bn(module: nn.Module, batches: Iterable[torch.Tensor], *, keep_original: bool = True) -> int:
    """Reset every BN's running statistics and re-estimate them as the exact average over
    ``batches`` (momentum None). Runs ``forward_all`` when the module has it, so the heads
    of early exits get statistics too. With ``keep_original`` the original network's BN
    layers keep theirs, and run in eval mode; without it (test-time adaptation, whose
    point is that the trained statistics no longer fit) every BN layer is re-estimated
    and everything else (dropout) stays in eval mode. Returns the number of samples seen."""
    norms = calibrated_norms(module) if keep_original else _norms(module)
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    was_training = module.training
    if keep_original:
        train_for_calibration(module)
    else:
        module.eval()
        for m in norms:
            m.train()
    seen = 0
    run = getattr(module, "forward_all", module)
    try:
        for xb in batches:
            run(xb)
            seen += len(xb)
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        module.train(was_training)
    return seen


@contextmanager
def frozen_bn_statistics(module: nn.Module) -> Iterator[None]:
    """BN layers normalise with batch statistics (train mode) but do not update their
    running statistics: momentum 0 leaves them as they are."""
    norms = _norms(module)
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
