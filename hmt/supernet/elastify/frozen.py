"""The original model's batch norms, frozen: always its running statistics, in any mode.

The original path of an elastified supernet must keep computing exactly what the user's
model computes. A ``FrozenBatchNorm`` is an ordinary ``nn.BatchNorm1d/2d/3d`` to every other
stage (cost models count it as the BN the engines fold, ONNX export writes a
BatchNormalization), but its forward always calls the eval-mode ``F.batch_norm`` the original
calls (bit-identical), and it ignores requests to reset or re-estimate its statistics (the
per-variant BN re-estimation of hmt.supernet.calibrate, training-mode forwards).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm


class FrozenBatchNorm(_BatchNorm):
    """Mixin base of the frozen norms below (use ``isinstance(m, FrozenBatchNorm)``)."""

    _ready = False

    def reset_running_stats(self) -> None:
        if not self._ready:  # during __init__: the buffers still need their first values
            super().reset_running_stats()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)

    def to_norm(self) -> _BatchNorm:
        """An ordinary, trainable copy (for an alternative built from the original block)."""
        plain = next(c for c in type(self).__mro__ if c in _PLAIN)
        norm = plain(self.num_features, eps=self.eps, momentum=self.momentum, affine=self.affine)
        with torch.no_grad():
            if self.affine:
                norm.weight.copy_(self.weight)
                norm.bias.copy_(self.bias)
            norm.running_mean.copy_(self.running_mean)
            norm.running_var.copy_(self.running_var)
        return norm


class FrozenBatchNorm1d(FrozenBatchNorm, nn.BatchNorm1d):
    pass


class FrozenBatchNorm2d(FrozenBatchNorm, nn.BatchNorm2d):
    pass


class FrozenBatchNorm3d(FrozenBatchNorm, nn.BatchNorm3d):
    pass


_PLAIN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_FROZEN: dict[type, type[FrozenBatchNorm]] = {
    nn.BatchNorm1d: FrozenBatchNorm1d,
    nn.BatchNorm2d: FrozenBatchNorm2d,
    nn.BatchNorm3d: FrozenBatchNorm3d,
}


def frozen_copy(norm: _BatchNorm) -> FrozenBatchNorm:
    """A frozen norm sharing ``norm``'s parameters and statistics (the same tensors)."""
    plain = next((c for c in type(norm).__mro__ if c in _FROZEN), None)
    if plain is None or norm.running_mean is None or norm.running_var is None:
        raise ValueError(f"cannot freeze {type(norm).__name__}")
    frozen = _FROZEN[plain](norm.num_features, eps=norm.eps, momentum=norm.momentum, affine=norm.affine)
    if norm.affine:
        frozen.weight, frozen.bias = norm.weight, norm.bias
    frozen.running_mean = norm.running_mean
    frozen.running_var = norm.running_var
    frozen.num_batches_tracked = norm.num_batches_tracked
    frozen._ready = True
    return frozen


def freeze(gm: fx.GraphModule) -> int:
    """Replace every batch norm ``gm`` calls by a frozen one sharing its tensors."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        m = gm.get_submodule(str(node.target))
        if isinstance(m, _BatchNorm) and not isinstance(m, FrozenBatchNorm) and m.track_running_stats:
            gm.set_submodule(str(node.target), frozen_copy(m))
            count += 1
    return count


def unfreeze(gm: fx.GraphModule) -> fx.GraphModule:
    """In a private copy, make frozen norms ordinary (trainable, re-estimable) batch norms."""
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        m = gm.get_submodule(str(node.target))
        if isinstance(m, FrozenBatchNorm):
            gm.set_submodule(str(node.target), m.to_norm())
    return gm
