"""Every registered backbone: materialised variants equal the supernet path; enumeration;
pretrained weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hmt.errors import ModelError, UsageError
from hmt.supernet import build_supernet
from hmt.supernet.backbones import BACKBONES
from hmt.supernet.metrics import measure_cost

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def _shape(backbone: str) -> tuple[int, ...]:
    return (6, 32) if backbone == "conv1d" else (3, 32, 32)


# The large backbones (10-40 M parameters with their alternatives) take tens of seconds
# each on a 2-core CPU: they run with -m slow; the CIFAR ResNets and conv1d cover every
# block kind's code paths except inverted/plain, which mobilenetv2 and vgg16_bn cover.
_LARGE = {"resnet18", "resnet34", "vgg16_bn", "mobilenetv2"}
_PARAMS = [pytest.param(b, marks=pytest.mark.slow) if b in _LARGE else b for b in sorted(BACKBONES)]


@pytest.fixture(scope="module", params=_PARAMS)
def prepared(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = build_supernet(request.param, num_classes=5, input_shape=_shape(request.param))
    net.prepare_alternatives()
    # Non-trivial BN statistics so that a wrong BN in a materialised copy shows.
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    return net.eval()


def test_materialized_equals_supernet_path(prepared) -> None:  # type: ignore[no-untyped-def]
    net = prepared
    rng = np.random.default_rng(0)
    x = torch.randn(2, *net.space.input_shape, generator=torch.Generator().manual_seed(1))
    archs = [net.space.largest(), net.space.smallest()] + [net.space.sample(rng) for _ in range(4)]
    with torch.no_grad():
        for arch in archs:
            variant = net.materialize(arch)
            torch.testing.assert_close(variant(x), net(x, arch), atol=1e-4, rtol=1e-4, msg=arch.arch_id)
            for got, want in zip(variant.forward_all(x), net.forward_exits(x, arch), strict=True):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            # No unused branches: the variant is never bigger than the supernet's path.
            assert sum(p.numel() for p in variant.parameters()) < sum(p.numel() for p in net.parameters())


def test_block_enumeration_covers_every_choice(prepared) -> None:  # type: ignore[no-untyped-def]
    net = prepared
    refs = list(net.iter_block_choices())
    pairs = {(r.position, r.choice) for r in refs}
    for pos in net.space.positions:
        assert {(pos.name, c) for c in pos.choices} <= pairs
    arch = net.space.sample(np.random.default_rng(3))
    assert set(net.variant_blocks(arch)) <= pairs
    for ref in refs[:6]:
        with torch.no_grad():
            ref.module(torch.zeros(1, *ref.input_shape))


def test_cost_of_largest_resnet18_matches_known_figures() -> None:
    net = build_supernet("resnet18", num_classes=10, input_shape=(3, 32, 32), operators=())
    cost = measure_cost(net.materialize(net.space.largest()), (3, 32, 32))
    assert cost.params == 11_173_962
    conv_linear_macs = sum(layer.macs for layer in cost.layers if layer.op_type in ("Conv2d", "Linear"))
    assert conv_linear_macs == 555_422_720  # the usual 0.56 GMACs of CIFAR ResNet-18
    assert cost.macs > conv_linear_macs  # BN scale-shift counted on top
    assert cost.memory_access_bytes == sum(layer.memory_access_bytes for layer in cost.layers)


def test_unknown_backbone_and_operator() -> None:
    with pytest.raises(UsageError, match="unknown backbone"):
        build_supernet("resnet9000", num_classes=10, input_shape=(3, 32, 32))
    with pytest.raises(UsageError, match="unknown operators"):
        build_supernet("cifar_resnet20", num_classes=10, input_shape=(3, 32, 32), operators=["bogus"])


@pytest.mark.skipif(not (SHARED / "models/resnet-cifar10").is_dir(), reason="shared pretrained models absent")
def test_pretrained_resnet20_loads_and_wrong_depth_is_refused() -> None:
    net = build_supernet("cifar_resnet20", num_classes=10, input_shape=(3, 32, 32))
    net.load_pretrained(SHARED / "models/resnet-cifar10/resnet20-12fca82f.th")
    assert net.blocks[0].conv1.weight.abs().sum() > 0
    wrong = build_supernet("cifar_resnet32", num_classes=10, input_shape=(3, 32, 32))
    with pytest.raises(ModelError, match="do not fit"):
        wrong.load_pretrained(SHARED / "models/resnet-cifar10/resnet20-12fca82f.th")
    no_map = build_supernet("resnet18", num_classes=10, input_shape=(3, 32, 32))
    with pytest.raises(ModelError, match="no pretrained"):
        no_map.load_pretrained(SHARED / "models/resnet-cifar10/resnet20-12fca82f.th")


def test_pretrained_refuses_pickle_payload(tmp_path: Path) -> None:
    import os
    import pickle

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "evil.th"
    bad.write_bytes(pickle.dumps({"state_dict": Payload()}))
    net = build_supernet("cifar_resnet20", num_classes=10, input_shape=(3, 32, 32))
    with pytest.raises(ModelError, match="weights-only"):
        net.load_pretrained(bad)
    assert not marker.exists()


def test_materialize_takes_an_arch_id_and_refuses_other_types() -> None:
    torch.manual_seed(0)
    net = build_supernet("cifar_resnet8", num_classes=10, input_shape=(3, 32, 32), operators=("w50", "skip")).eval()
    arch = net.space.sample(np.random.default_rng(0))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        np.testing.assert_array_equal(net.materialize(arch.arch_id)(x).numpy(), net.materialize(arch)(x).numpy())
    with pytest.raises(UsageError, match="is not of the form"):
        net.materialize("not-an-id")
    with pytest.raises(UsageError, match="expected an ArchConfig or an arch id string, got int"):
        net.materialize(3)  # type: ignore[arg-type]
