"""Tiny models written to files, as users give them to ``hmt convert --model``."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(x.mean((2, 3))))


def tiny():
    torch.manual_seed(0)
    net = Tiny()
    net.bn.running_mean.uniform_(-1, 1)
    net.bn.running_var.uniform_(0.5, 2)
    return net


def broken():
    raise RuntimeError("factory exploded on purpose")


class Segmented(nn.Module):
    """Shaped like a materialised supernet variant: segments + one exit head per segment."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.segments = nn.ModuleList([
            nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
            nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        ])
        self.exit_heads = nn.ModuleList([
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)),
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)),
        ])
        self.input_shape = (3, 16, 16)

    def forward(self, x):
        for segment in self.segments:
            x = segment(x)
        return self.exit_heads[-1](x)


def segmented():
    return Segmented().eval()


class Liar(nn.Module):
    """Exports something other than what it computes eagerly (verification must catch it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            return self.fc(x) * 1.5
        return self.fc(x)


def liar():
    torch.manual_seed(0)
    return Liar()
'''


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "net.py"
    path.write_text(TINY)
    return path
