"""Tiny models for the adaptation tests: a chain of conv-BN-ReLU blocks with two exits."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn


@pytest.fixture(scope="package", autouse=True)
def _one_thread() -> Iterator[None]:
    # On a shared machine one intra-op thread avoids oversubscription (measured: the
    # fixture model trained 6x faster); restored so other packages' timings are unaffected.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class TinyVariant(nn.Module):
    """The shape of a materialised supernet variant: segments + exit heads + forward_all."""

    def __init__(self, width: int = 16, blocks: int = 3) -> None:
        super().__init__()

        def block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True))

        seg0 = [block(3, width)] + [block(width, width) for _ in range(blocks - 1)]
        seg1 = [block(width, 2 * width, 2)] + [block(2 * width, 2 * width) for _ in range(blocks - 1)]
        self.segments = nn.ModuleList([nn.Sequential(*seg0), nn.Sequential(*seg1)])

        def head(c: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Dropout(0.2), nn.Linear(c, 10))

        self.exit_heads = nn.ModuleList([head(width), head(2 * width)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_all(x)[-1]

    def forward_all(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for seg, head in zip(self.segments, self.exit_heads, strict=True):
            x = seg(x)
            out.append(head(x))
        return out


def trained_tiny(seed: int = 0) -> tuple[TinyVariant, torch.Tensor, torch.Tensor]:
    """A TinyVariant fitted for a few steps to separable synthetic data, and that data."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 3, 1, 1, generator=g) * 1.5
    y = torch.arange(100) % 10
    x = centres[y] + torch.randn(100, 3, 12, 12, generator=g)
    torch.manual_seed(seed)  # before building: the initial weights come from the global generator
    model = TinyVariant(width=8, blocks=2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(25):
        loss = sum(nn.functional.cross_entropy(o, y) for o in model.forward_all(x))
        opt.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        opt.step()
    return model.eval(), x, y


@pytest.fixture(scope="session")
def tiny_trained() -> tuple[TinyVariant, torch.Tensor, torch.Tensor]:
    return trained_tiny()
