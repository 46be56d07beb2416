"""eta3: compound scaling. Width options live in eta6 (``blocks.py``); stride is fixed by the
stage, since every later block and exit depends on the feature-map size. This module
provides the kernel-size option: a k' x k' unit (k' = 1 by default) initialised from the
centre of the original kernel, the way Once-for-All shares kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from hmt.supernet.operators.common import conv_bn


def make_kernel_unit(
    dims: int,
    in_ch: int,
    out_ch: int,
    kernel: int,
    stride: int,
    source: nn.Module | None = None,
    source_kernel: int = 3,
) -> nn.Sequential:
    unit = conv_bn(dims, in_ch, out_ch, kernel, stride)
    if source is not None:
        weight = source.weight
        start = (source_kernel - kernel) // 2
        with torch.no_grad():
            if dims == 2:
                unit[0].weight.copy_(weight[:, :, start : start + kernel, start : start + kernel])
            else:
                unit[0].weight.copy_(weight[:, :, start : start + kernel])
    return unit
