"""The original model's batch norms, frozen: always its running statistics, in any mode.

The original path of an elastified supernet must keep computing exactly what the user's
model computes. ``FrozenBatchNorm`` is not a ``_BatchNorm``, so neither training nor the
per-variant re-estimation of BN statistics (hmt.supernet.calibrate) touches it, and it
calls the same ``F.batch_norm`` kernel the original calls in eval mode: bit-identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm


class FrozenBatchNorm(nn.Module):
    def __init__(self, num_features: int, *, eps: float, affine: bool) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.affine = affine
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    @classmethod
    def from_norm(cls, norm: _BatchNorm) -> FrozenBatchNorm:
        if norm.running_mean is None or norm.running_var is None:
            raise ValueError("a batch norm without running statistics cannot be frozen")
        frozen = cls(norm.num_features, eps=norm.eps, affine=norm.affine)
        frozen.weight, frozen.bias = norm.weight, norm.bias  # shared: the same Parameters
        frozen.running_mean = norm.running_mean
        frozen.running_var = norm.running_var
        return frozen

    def to_norm(self, dims: int) -> _BatchNorm:
        cls = nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d
        norm = cls(self.num_features, eps=self.eps, affine=self.affine)
        with torch.no_grad():
            if self.affine:
                norm.weight.copy_(self.weight)
                norm.bias.copy_(self.bias)
            norm.running_mean.copy_(self.running_mean)
            norm.running_var.copy_(self.running_var)
        return norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


def freeze(gm: fx.GraphModule) -> int:
    """Replace every batch norm ``gm`` calls by a FrozenBatchNorm sharing its tensors."""
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        m = gm.get_submodule(str(node.target))
        if isinstance(m, _BatchNorm) and m.track_running_stats:
            gm.set_submodule(str(node.target), FrozenBatchNorm.from_norm(m))
            count += 1
    return count


def unfreeze(gm: fx.GraphModule) -> fx.GraphModule:
    """In a private copy, make frozen norms ordinary (trainable, re-estimable) batch norms."""
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        m = gm.get_submodule(str(node.target))
        if isinstance(m, FrozenBatchNorm):
            dims = len(node.meta["tensor_meta"].shape) - 2 if "tensor_meta" in node.meta else 2
            gm.set_submodule(str(node.target), m.to_norm(dims))
    return gm
