"""Issue 11: stream (stage output) widths in the space, ids and JSON, the supernet path equal
to the materialised variant, and every unit a variant runs enumerated for the cost tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hmt.errors import UsageError
from hmt.supernet.space import SearchSpace
from hmt.supernet.supernet import build_supernet

OPS = ("w75", "w50", "w25", "lr50", "skip", "sw75", "sw50", "sw25")


@pytest.fixture(scope="module")
def net():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = build_supernet("cifar_resnet8", num_classes=10, input_shape=(3, 32, 32), operators=OPS)
    net.prepare_alternatives()
    for m in net.modules():  # non-trivial statistics, so a wrong slice shows
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def test_width_positions_head_every_stage(net) -> None:  # type: ignore[no-untyped-def]
    kinds = [(p.stage, p.kind) for p in net.space.positions]
    assert kinds == [(0, "width"), (0, "basic"), (1, "width"), (1, "basic"), (2, "width"), (2, "basic")]
    assert net.space.positions[0].choices == ("base", "w75", "w50", "w25")


def test_ids_and_json_round_trip(net) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1)
    space = SearchSpace.from_json_dict(net.space.to_json_dict())
    assert space.tag == net.space.tag
    for _ in range(30):
        arch = net.space.sample(rng)
        assert space.parse(arch.arch_id) == arch
        assert space.from_json(arch.to_json_dict()) == arch


def test_slim_stream_canonicalises_operators_it_cannot_run(net) -> None:  # type: ignore[no-untyped-def]
    arch = net.space.make(["w50", "lr50", "base", "base", "base", "base"])
    assert arch.choices[1] == "base"  # low-rank is built for the full stream
    with pytest.raises(UsageError, match="not canonical"):
        net.space.parse(arch.arch_id.replace(".5B", ".5L"))
    assert net.space.make(["base", "lr50", "base", "base", "base", "base"]).choices[1] == "lr50"


def test_materialised_variant_equals_supernet_path(net) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    x = torch.randn(3, 3, 32, 32)
    archs = [net.space.largest(), net.space.smallest()] + [net.space.sample(rng) for _ in range(12)]
    for arch in archs:
        with torch.no_grad():
            torch.testing.assert_close(net.materialize(arch)(x), net(x, arch), atol=1e-5, rtol=0)


def test_stream_width_slims_the_materialised_variant(net) -> None:  # type: ignore[no-untyped-def]
    full = net.space.make(["base", "w50", "base", "w50", "base", "w50"])
    slim = net.space.make(["w50", "w50", "w50", "w50", "w50", "w50"])
    # The stream halves: each conv reads (or writes) half the channels, half the weights.
    params = [sum(p.numel() for p in net.materialize(a).segments.parameters()) for a in (full, slim)]
    assert params[1] < 0.55 * params[0]


def test_every_unit_a_variant_runs_is_enumerated(net) -> None:  # type: ignore[no-untyped-def]
    refs = {(r.position, r.choice): r for r in net.iter_block_choices()}
    rng = np.random.default_rng(2)
    for arch in [net.space.largest(), *(net.space.sample(rng) for _ in range(25))]:
        for pair in net.variant_blocks(arch):
            assert pair in refs, pair
    for ref in refs.values():  # each runs at its recorded input shape
        with torch.no_grad():
            ref.module(torch.zeros(1, *ref.input_shape))


def test_stream_widths_need_basic_blocks() -> None:
    with pytest.raises(UsageError, match="stream widths"):
        build_supernet("mobilenetv2", num_classes=10, input_shape=(3, 32, 32), operators=("w50", "sw50"))
