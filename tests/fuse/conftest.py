from __future__ import annotations

from pathlib import Path

import pytest

NET = '''
import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),
            nn.Conv2d(8, 16, 1),
        )
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def small():
    return Small().eval()
'''


@pytest.fixture(scope="session")
def converted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hmt.convert import TorchSource, convert_model

    root = tmp_path_factory.mktemp("fuse")
    (root / "net.py").write_text(NET)
    out = root / "converted"
    convert_model(TorchSource(f"{root / 'net.py'}:small", ((1, 3, 16, 16),)), out)
    return out


SEGMENTED = '''
import torch
from torch import nn


class Segmented(nn.Module):
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

    def forward(self, x):
        for segment in self.segments:
            x = segment(x)
        return self.exit_heads[-1](x)


def segmented():
    return Segmented().eval()
'''


@pytest.fixture(scope="session")
def segmented_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hmt.convert import TorchSource, convert_model

    root = tmp_path_factory.mktemp("fuse-seg")
    (root / "seg.py").write_text(SEGMENTED)
    out = root / "converted"
    convert_model(TorchSource(f"{root / 'seg.py'}:segmented", ((1, 3, 16, 16),)), out)
    return out
