"""Issue 11: the sandwich step's subnet sampling: width levels (structured subnets), late
exits, and the plain uniform recipe replaying exactly when both are off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hmt.errors import UsageError
from hmt.supernet.space import WIDTH_KIND
from hmt.supernet.supernet import build_supernet
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.phases import SubnetSampling, iter_finetune_archs

OPS = ("w75", "w50", "w25", "lr50", "skip", "sw75", "sw50", "sw25")


@pytest.fixture(scope="module")
def net():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return build_supernet("cifar_resnet8", num_classes=10, input_shape=(3, 32, 32), operators=OPS)


def test_structured_subnets_share_one_stream_and_one_inner_width(net) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):
        arch = net.space.sample_structured(rng, exit_stage=net.space.num_stages - 1)
        stream = {c for p, c in zip(net.space.positions, arch.choices, strict=True) if p.kind == WIDTH_KIND}
        inner = {c for p, c in zip(net.space.positions, arch.choices, strict=True) if p.kind != WIDTH_KIND}
        assert len(stream) == 1 and len(inner) == 1, arch.arch_id
        assert inner <= {"base", "w75", "w50", "w25"} and stream <= {"base", "w75", "w50", "w25"}
        assert net.space.parse(arch.arch_id) == arch
        seen.add((stream.pop(), inner.pop()))
    assert len(seen) == 16  # every (stream, inner) level pair is drawn


def test_tied_levels_scale_stream_and_inner_widths_alike(net) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(100):
        arch = net.space.sample_structured(rng, exit_stage=net.space.num_stages - 1, tied=True)
        levels = {c for p, c in zip(net.space.positions, arch.choices, strict=True) if c != "skip"}
        assert len(levels) == 1, arch.arch_id
        seen |= levels
    assert seen == {"base", "w75", "w50", "w25"}
    tied = SubnetSampling(random_subnets=1, structured_share=1.0, exits="late", tied_share=1.0)
    arch = tied.draw(net.space, np.random.default_rng(4))
    assert len({c for c in arch.choices if c != "-"}) == 1


def test_late_exits_and_full_structured_share(net) -> None:  # type: ignore[no-untyped-def]
    sampling = SubnetSampling(random_subnets=3, structured_share=1.0, exits="late")
    rng = np.random.default_rng(1)
    last = net.space.num_stages - 1
    exits = set()
    for _ in range(50):
        archs = list(iter_finetune_archs(net.space, rng, sampling))
        assert archs[0] == net.space.smallest() and len(archs) == 4
        for arch in archs[1:]:
            exits.add(arch.exit_stage)
            inner = {c for p, c in zip(net.space.positions, arch.choices, strict=True)
                     if p.kind != WIDTH_KIND and p.stage <= arch.exit_stage}
            assert len(inner) == 1
    assert exits == {last - 1, last}


def test_plain_recipe_replays_the_uniform_draws(net) -> None:  # type: ignore[no-untyped-def]
    sampling = SubnetSampling(random_subnets=5)
    got = [a.arch_id for a in iter_finetune_archs(net.space, np.random.default_rng(7), sampling)][1:]
    rng = np.random.default_rng(7)
    assert got == [net.space.sample(rng).arch_id for _ in range(5)]


@pytest.mark.parametrize(("field", "value"), [("finetune_structured_share", 1.5), ("finetune_exits", "early")])
def test_config_refuses_bad_sampling(field: str, value: object) -> None:
    with pytest.raises(UsageError, match=field):
        TrainConfig(**{field: value}).validate()  # type: ignore[arg-type]


def test_training_draws_with_the_configured_sampling(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The config's share and exits reach the sandwich step (not only the sampler's unit)."""
    from hmt.supernet.train import phases, resolve_config, train_supernet

    seen: list[SubnetSampling] = []
    real_draw = SubnetSampling.draw

    def spy(self, space, rng):  # type: ignore[no-untyped-def]
        seen.append(self)
        return real_draw(self, space, rng)

    monkeypatch.setattr(phases.SubnetSampling, "draw", spy)
    config = resolve_config(overrides={
        "backbone": "cifar_resnet8", "operators": list(OPS), "batch_size": 32, "max_train_samples": 64,
        "backbone_epochs": 1, "partition_epochs": 0, "distill_epochs": 0, "finetune_epochs": 1,
        "eval_variants": 1, "finetune_random_subnets": 2, "finetune_structured_share": 1.0,
        "finetune_exits": "late", "val_fraction": 0.05,
    })
    train_supernet(config, tmp_path / "s")
    assert seen and set(seen) == {SubnetSampling(2, 1.0, "late")}
