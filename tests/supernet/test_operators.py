"""Compression operators: shapes, SVD initialisation, kernel centres."""

from __future__ import annotations

import pytest
import torch

from hmt.supernet.operators import (
    FireUnit,
    GhostUnit,
    LowRankUnit,
    conv,
    make_depthwise_separable_unit,
    make_kernel_unit,
)
from hmt.supernet.operators.lowrank import full_rank


def _input(dims: int, channels: int) -> torch.Tensor:
    shape = (2, channels, 9, 9) if dims == 2 else (2, channels, 17)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize(
    "make",
    [
        lambda d, i, o, s: LowRankUnit(d, i, o, 3, s, rank=3),
        lambda d, i, o, s: make_depthwise_separable_unit(d, i, o, 3, s),
        lambda d, i, o, s: FireUnit(d, i, o, 3, s),
        lambda d, i, o, s: GhostUnit(d, i, o, 3, s),
        lambda d, i, o, s: make_kernel_unit(d, i, o, 1, s),
    ],
    ids=["lowrank", "dws", "fire", "ghost", "kernel1"],
)
def test_unit_output_shape_matches_conv(make, dims: int, stride: int) -> None:  # type: ignore[no-untyped-def]
    x = _input(dims, 6)
    reference = conv(dims, 6, 7, 3, stride)(x)
    assert make(dims, 6, 7, stride).eval()(x).shape == reference.shape


@pytest.mark.parametrize("dims", [1, 2])
def test_svd_at_full_rank_reproduces_original_conv(dims: int) -> None:
    torch.manual_seed(0)
    original = conv(dims, 5, 8, 3, 1)
    unit = LowRankUnit(dims, 5, 8, 3, 1, rank=full_rank(5, 8, 3, dims)).eval()
    unit.init_from_svd(original.weight)
    x = _input(dims, 5)
    # Identity BN in eval mode (fresh running stats: mean 0, var 1) up to its epsilon.
    expected = original(x) / torch.sqrt(torch.tensor(1.0 + unit.norm.eps))
    torch.testing.assert_close(unit(x), expected, atol=1e-4, rtol=1e-4)


def test_svd_low_rank_error_shrinks_with_rank() -> None:
    torch.manual_seed(0)
    original = conv(2, 16, 16, 3, 1)
    x = _input(2, 16)
    errors = []
    for rank in (2, 8, 16):
        unit = LowRankUnit(2, 16, 16, 3, 1, rank=rank).eval()
        unit.init_from_svd(original.weight)
        errors.append(float((unit.expand(unit.reduce(x)) - original(x)).pow(2).mean()))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-8


def test_kernel_unit_takes_kernel_centre() -> None:
    source = conv(2, 3, 4, 3, 1)
    unit = make_kernel_unit(2, 3, 4, 1, 1, source=source, source_kernel=3)
    torch.testing.assert_close(unit[0].weight[:, :, 0, 0], source.weight[:, :, 1, 1])
