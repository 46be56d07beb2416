"""A tiny stand-in supernet with the hmt.supernet contract profile-device relies on.

``iter_block_choices`` / ``variant_blocks`` / ``materialize`` / ``space.sample`` and a
verified artifact (kind "supernet"), small enough that a block table takes a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.profile import benchmarks as bench
from hmt.profile import run as run_module
from hmt.profile import stages, timing
from hmt.profile.probes import ProbeSpec


@dataclass(frozen=True)
class Ref:
    position: str
    choice: str
    module: nn.Module
    input_shape: tuple[int, ...]


@dataclass(frozen=True)
class Arch:
    choices: tuple[tuple[str, str], ...]

    @property
    def arch_id(self) -> str:
        return "-".join(c for _, c in self.choices)


def _sep(c: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c), nn.Conv2d(c, c, 1), nn.ReLU())


class TinyNet:
    def __init__(self, width: int = 16, size: int = 16) -> None:
        torch.manual_seed(0)
        c = width
        self.input_shape = (3, size, size)
        self.blocks: dict[str, dict[str, tuple[nn.Module, tuple[int, ...]]]] = {
            "stem": {"conv3x3": (nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU()), (3, size, size))},
            "s0.b0": {"conv3x3": (nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU()), (c, size, size)),
                      "sep": (_sep(c), (c, size, size)),
                      "wide": (nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(),
                                             nn.Conv2d(2 * c, c, 1)), (c, size, size))},
            "s0.b1": {"conv3x3": (nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU()), (c, size, size)),
                      "sep": (_sep(c), (c, size, size)),
                      "c1x1": (nn.Sequential(nn.Conv2d(c, c, 1), nn.ReLU()), (c, size, size))},
            "s1.b0": {"down": (nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU()), (c, size, size)),
                      "down-sep": (nn.Sequential(nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c),
                                                 nn.Conv2d(c, 2 * c, 1), nn.ReLU()), (c, size, size))},
            "exit": {"head": (nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, 10)),
                              (2 * c, size // 2, size // 2))},
        }
        for choices in self.blocks.values():
            for module, _ in choices.values():
                module.eval()

    def iter_block_choices(self) -> list[Ref]:
        return [Ref(p, ch, m, s) for p, choices in self.blocks.items() for ch, (m, s) in choices.items()]

    def variant_blocks(self, arch: Arch) -> list[tuple[str, str]]:
        return list(arch.choices)

    def materialize(self, arch: Arch) -> nn.Module:
        model = nn.Sequential(*[self.blocks[p][c][0] for p, c in arch.choices]).eval()
        model.input_shape = self.input_shape  # type: ignore[assignment]
        return model


@dataclass
class TinySpace:
    net: TinyNet

    def sample(self, rng: np.random.Generator) -> Arch:
        return Arch(tuple((p, list(ch)[int(rng.integers(len(ch)))]) for p, ch in self.net.blocks.items()))

    def largest(self) -> Arch:
        return Arch(tuple((p, next(iter(ch))) for p, ch in self.net.blocks.items()))

    def smallest(self) -> Arch:
        return Arch(tuple((p, list(ch)[-1]) for p, ch in self.net.blocks.items()))


@dataclass
class Loaded:
    net: TinyNet
    space: TinySpace
    artifact: Any
    extra: dict[str, Any] = field(default_factory=dict)


def make_supernet_artifact(root: Path) -> Any:
    with ArtifactWriter(root, kind="supernet", config={"stand_in": True}) as writer:
        writer.write_json("space.json", {"tiny": True})
    return load_artifact(root, kind="supernet")


@pytest.fixture
def tiny_loaded(tmp_path: Path) -> Loaded:
    net = TinyNet()
    return Loaded(net, TinySpace(net), make_supernet_artifact(tmp_path / "supernet"))


# profile_device in seconds: tiny micro-benchmarks and probes, the stand-in supernet.
TINY = bench.BenchmarkSettings(gemm_sizes=(64,), conv_hw=8, repeats=2, min_time_s=0.002,
                               bandwidth_sizes=(16 << 10, 1 << 20, 8 << 20), cold_sizes=(64 << 10, 1 << 20, 8 << 20),
                               cold_trials=2, flush_bytes=8 << 20)
PROBES = [ProbeSpec(f"c{k}-{c}-{s}", "conv2d", c, c, k, 1, s) for k in (1, 3) for c in (8, 32) for s in (4, 16)]
PROBES += [ProbeSpec("lin", "linear", 64, 10), ProbeSpec("dw", "dwconv2d", 16, 16, 3, 1, 8)]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch, tiny_loaded: Any) -> Any:
    monkeypatch.setattr(bench.BenchmarkSettings, "quick", classmethod(lambda cls: TINY))
    monkeypatch.setattr(run_module, "probe_grid", lambda quick: PROBES)
    monkeypatch.setattr(bench, "run_perf_stat", lambda: bench.PerfCounters(False, {}, "disabled in tests"))
    monkeypatch.setattr(stages, "open_supernet", lambda path: tiny_loaded)
    monkeypatch.setattr(timing, "MIN_WINDOW_S", 0.005)
    real_calibrate = stages.calibrate
    monkeypatch.setattr(stages, "calibrate", lambda *a, **k: real_calibrate(
        *a, **{**k, "window_s": 0.05, "idle_s": 0.05, "sync_s": 0.05}))
    return tiny_loaded
