"""Stream widths for elastified models: the residual stream narrows per stage, sliced from
the original's weights by importance; the original stays exact, every variant
materialises to a plain module computing what the supernet computes, and an artifact
rebuilt without the original's weights gets the same index sets back."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from hmt.supernet.elastify.distill import distill_loss
from hmt.supernet.elastify.supernet import ElastifiedSupernet, largest_error
from hmt.supernet.space import WIDTH_KIND

HERE = Path(__file__).resolve().parent
OPERATORS = ("w50", "w25", "skip", "sw75", "sw50", "sw25")


def _models() -> object:
    spec = importlib.util.spec_from_file_location("elastify_models_stream", HERE / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def resnet() -> tuple[torch.nn.Module, ElastifiedSupernet]:
    model = _models().tiny_resnet()  # type: ignore[attr-defined]
    return model, ElastifiedSupernet(copy.deepcopy(model), name="tiny", input_shape=(3, 32, 32),
                                     operators=OPERATORS).eval()


def test_every_stage_gets_a_stream_width_and_the_original_stays_exact(resnet: tuple) -> None:
    model, net = resnet
    widths = [p for p in net.space.positions if p.kind == WIDTH_KIND]
    assert [p.name for p in widths] == ["s0.width", "s1.width", "s2.width"]
    assert all(p.choices == ("base", "w75", "w50", "w25") for p in widths)
    assert largest_error(net, model, seed=0) == 0.0
    # Without the sw operators the space is the one it always was.
    plain = ElastifiedSupernet(copy.deepcopy(model), name="tiny", input_shape=(3, 32, 32), operators=("w50",))
    assert not plain.space.has_stream_widths and plain.stream is None


def test_slim_variants_materialise_to_what_the_supernet_computes(resnet: tuple) -> None:
    _, net = resnet
    rng = np.random.default_rng(0)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    half = net.space.make(["w50"] * len(net.space.positions))  # 50% streams, 50% inner widths
    archs = [net.space.smallest(), half, *[net.space.sample_structured(rng) for _ in range(3)],
             *[net.space.sample(rng) for _ in range(3)]]
    assert any(w != "base" for a in archs for w in net.space.stage_widths(a))
    with torch.no_grad():
        for arch in archs:
            variant = net.materialize(arch)
            assert torch.allclose(variant(x), net(x, arch), atol=1e-5, rtol=0), arch.arch_id
    # A 50% stream everywhere halves every conv of the stream: a quarter of the MACs or so.
    full_params = sum(p.numel() for p in net.materialize(net.space.largest()).parameters())
    half_params = sum(p.numel() for p in net.materialize(half).parameters())
    assert half_params < 0.35 * full_params


def test_identity_shortcuts_tie_a_stage_to_one_channel_ranking(resnet: tuple) -> None:
    _, net = resnet
    stream = net.stream
    blocks = net.space.block_positions()
    groups = [stream.group_of[p] for p in blocks]
    # stem -> s0.b0 -> s0.b1 share the stem's channels; each later stage starts a group
    # at its projection block that its identity block joins.
    assert groups[0] == groups[1] == stream.group_of[-1]
    assert groups[2] == groups[3] != groups[1] and groups[4] == groups[5] != groups[3]
    kept = stream.index(blocks[1], "w50")
    assert kept is not None and len(kept) == 4 and len(set(kept.tolist())) == 4


@pytest.mark.slow
def test_rebuilt_without_weights_gets_the_index_sets_back(resnet: tuple) -> None:
    _, net = resnet
    fresh = _models().TinyResNet()  # type: ignore[attr-defined]
    rebuilt = ElastifiedSupernet(fresh, name="tiny", input_shape=(3, 32, 32), operators=OPERATORS, init=False)
    rebuilt.load_state_dict(net.state_dict())
    rebuilt.eval()
    x = torch.randn(2, 3, 32, 32)
    arch = net.space.smallest()
    with torch.no_grad():
        assert torch.equal(rebuilt(x, arch), net(x, arch))


@pytest.mark.slow
def test_distillation_reaches_slim_units_and_leaves_the_original(resnet: tuple) -> None:
    model, net = resnet
    net = copy.deepcopy(net).train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(3)
    optimizer = torch.optim.SGD(net.elastic_parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        distill_loss(net, torch.randn(4, 3, 32, 32), rng).backward()
        optimizer.step()
    after = net.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert any(k.startswith("stream.parents.") for k in moved)
    assert not any(k.startswith(("stem.", "exits.2.")) or ".base." in k for k in moved)
    assert largest_error(net.eval(), model, seed=1) == 0.0


def test_a_1d_model_narrows_and_a_concatenating_one_says_why_not() -> None:
    models = _models()
    model = models.net_1d()  # type: ignore[attr-defined]
    net = ElastifiedSupernet(copy.deepcopy(model), name="n1d", input_shape=(6, 64),
                             operators=("w50", "skip", "sw50")).eval()
    assert net.space.has_stream_widths and largest_error(net, model, seed=0) == 0.0
    x = torch.randn(2, 6, 64)
    arch = net.space.make(["w50" if "w50" in p.choices else "base" for p in net.space.positions])
    assert net.space.stage_widths(arch) == ["w50", "w50"]
    with torch.no_grad():
        assert torch.allclose(net.materialize(arch)(x), net(x, arch), atol=1e-5, rtol=0)
    branches = ElastifiedSupernet(models.user_net(), name="u", input_shape=(3, 32, 32),  # type: ignore[attr-defined]
                                  operators=("sw50",))
    assert not branches.space.has_stream_widths
    assert branches.report()["stream_widths"].startswith("no stream widths: ") and "cat" in \
        branches.report()["stream_widths"]


class _Block1d(torch.nn.Module):
    """A residual 1-D block, its inner channels gated (SE) by a pool written with negative dims."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = torch.nn.Sequential(torch.nn.Conv1d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm1d(c),
                                        torch.nn.ReLU())
        self.gate = torch.nn.Conv1d(c, c, 1)
        self.project = torch.nn.Sequential(torch.nn.Conv1d(c, c, 1, bias=False), torch.nn.BatchNorm1d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return x + self.project(y * torch.sigmoid(self.gate(y.mean(-1, True))))


class _NegativeDims(torch.nn.Module):
    """Pools written as users write them: x.mean(-1) in the head, mean(-1, True) in an SE gate."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv1d(6, 16, 3, padding=1, bias=False), torch.nn.BatchNorm1d(16))
        self.blocks = torch.nn.Sequential(_Block1d(16), _Block1d(16))
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean(-1))


def test_pools_over_negative_dims_keep_channels() -> None:
    """mean(-1) of a (batch, C, L) tensor is over L: the head and the SE gate keep channel i at
    position i, so the stream narrows and the blocks get inner widths (negative dims were taken
    for the channel dimension, and both were refused)."""
    torch.manual_seed(0)
    model = _NegativeDims().eval()
    net = ElastifiedSupernet(copy.deepcopy(model), name="neg", input_shape=(6, 32),
                             operators=("w50", "skip", "sw50")).eval()
    assert net.space.has_stream_widths, net.report()["stream_widths"]
    assert all("w50" in p.choices for p in net.space.positions if p.kind != WIDTH_KIND)
    assert largest_error(net, model, seed=0) == 0.0
    arch = net.space.make(["w50" if "w50" in p.choices else "base" for p in net.space.positions])
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        assert torch.allclose(net.materialize(arch)(x), net(x, arch), atol=1e-5, rtol=0)



class _ViewHead(torch.nn.Module):
    """A ResNet written the classic way: a pool module, then x.view(x.size(0), -1) (or x.shape[0])."""

    def __init__(self, batch_from_shape: bool) -> None:
        super().__init__()
        self.batch_from_shape = batch_from_shape
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8))
        self.blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, bias=False),
                                                                torch.nn.BatchNorm2d(8)) for _ in range(2)])
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = torch.relu(x + block(x))
        x = self.avgpool(x)
        x = x.view(x.shape[0] if self.batch_from_shape else x.size(0), -1)
        return self.fc(x)


@pytest.mark.parametrize("batch_from_shape", [False, True])
def test_a_view_by_batch_size_head_keeps_the_stream_and_the_stage(batch_from_shape: bool) -> None:
    """x.size(0) reads the batch size, not the channels (it refused stream widths); x.shape[0]
    belongs to the head like the view it feeds (the pool before it went into the last block,
    which became a stage of its own)."""
    torch.manual_seed(0)
    model = _ViewHead(batch_from_shape).eval()
    net = ElastifiedSupernet(copy.deepcopy(model), name="view", input_shape=(3, 16, 16),
                             operators=("w50", "skip", "sw50")).eval()
    assert net.space.num_stages == 1 and [p.name for p in net.space.positions] == ["s0.width", "s0.b0", "s0.b1"]
    assert net.space.has_stream_widths, net.report()["stream_widths"]
    assert largest_error(net, model, seed=0) == 0.0
    arch = net.space.make(["w50" if "w50" in p.choices else "base" for p in net.space.positions])
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(net.materialize(arch)(x), net(x, arch), atol=1e-5, rtol=0)
