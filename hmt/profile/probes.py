"""Probe layers: a fixed grid of single layers timed to fit the eq. 2 coefficients.

The grid spans what the supernets are made of (3x3, 1x1, depthwise and strided convs,
1-D convs, linear heads) over small-to-large channel counts and spatial sizes, so the fit
sees both compute-bound and memory-bound layers. No supernet is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    kind: str  # conv2d | dwconv2d | conv1d | linear
    c_in: int
    c_out: int
    kernel: int = 3
    stride: int = 1
    size: int = 32  # spatial side (2-D), length (1-D); ignored for linear

    def build(self) -> tuple[nn.Module, tuple[int, ...]]:
        from torch import nn

        pad = self.kernel // 2
        if self.kind == "conv2d":
            return nn.Conv2d(self.c_in, self.c_out, self.kernel, self.stride, pad).eval(), (self.c_in, self.size,
                                                                                               self.size)
        if self.kind == "dwconv2d":
            return (nn.Conv2d(self.c_in, self.c_in, self.kernel, self.stride, pad, groups=self.c_in).eval(),
                    (self.c_in, self.size, self.size))
        if self.kind == "conv1d":
            return nn.Conv1d(self.c_in, self.c_out, self.kernel, self.stride, pad).eval(), (self.c_in, self.size)
        if self.kind == "linear":
            return nn.Linear(self.c_in, self.c_out).eval(), (self.c_in,)
        raise ValueError(f"unknown probe kind {self.kind!r}")


def probe_grid(*, quick: bool) -> list[ProbeSpec]:
    specs: list[ProbeSpec] = []
    sizes = (8, 32) if quick else (8, 16, 32)
    widths = ((16, 16), (64, 64)) if quick else ((16, 16), (32, 64), (64, 64), (128, 128))
    for size in sizes:
        for c_in, c_out in widths:
            specs.append(ProbeSpec(f"conv3x3-{c_in}-{c_out}-{size}", "conv2d", c_in, c_out, 3, 1, size))
            specs.append(ProbeSpec(f"conv1x1-{c_in}-{c_out}-{size}", "conv2d", c_in, c_out, 1, 1, size))
            specs.append(ProbeSpec(f"dw3x3-{c_in}-{size}", "dwconv2d", c_in, c_in, 3, 1, size))
        if not quick:
            specs.append(ProbeSpec(f"conv3x3s2-32-64-{size}", "conv2d", 32, 64, 3, 2, size))
    specs += [ProbeSpec("conv1d-9x32-64", "conv1d", 32, 64, 9, 1, 128),
              ProbeSpec("linear-256-10", "linear", 256, 10),
              ProbeSpec("linear-1024-1024", "linear", 1024, 1024)]
    if not quick:
        specs += [ProbeSpec("conv3x3-3-16-32", "conv2d", 3, 16, 3, 1, 32),
                  ProbeSpec("conv1d-5x64-64", "conv1d", 64, 64, 5, 1, 256),
                  ProbeSpec("linear-512-512", "linear", 512, 512)]
    return specs
