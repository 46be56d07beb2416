"""Issue 11: the largest variant is the user's network, exact, after training; the slim
widths train their own copy; frozen partitions keep their BN statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hmt.supernet import load_supernet
from hmt.supernet.supernet import build_supernet
from hmt.supernet.train import phases
from hmt.supernet.train.config import resolve_config
from hmt.supernet.train.trainer import train_supernet_model

FAST = {
    "backbone": "cifar_resnet8",
    "batch_size": 32,
    "max_train_samples": 64,
    "backbone_epochs": 1,
    "partition_epochs": 1,
    "distill_epochs": 1,
    "finetune_epochs": 1,
    "eval_variants": 1,
    "finetune_random_subnets": 1,
    "eval_batch_size": 256,
    "val_fraction": 0.05,
}


def _original_state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    keys = net.original_state_keys()
    return {k: v.detach().clone() for k, v in net.state_dict().items() if k in keys and "num_batches" not in k}


def test_largest_variant_stays_the_original_after_training(tmp_path: Path) -> None:
    # Train the backbone alone first: that network is "the user's model".
    backbone_only = resolve_config(overrides={**FAST, "partition_epochs": 0, "distill_epochs": 0, "finetune_epochs": 0})
    trained = train_supernet_model(backbone_only, checkpoint_dir=tmp_path / "a")
    before = _original_state(trained.net)
    x = torch.randn(4, *trained.net.space.input_shape)
    trained.net.eval()
    with torch.no_grad():
        original_out = trained.net(x, trained.net.space.largest())
    # The whole recipe, resumed from the same checkpoint, with the original frozen.
    full = resolve_config(overrides=FAST)
    assert not full.finetune_original
    again = train_supernet_model(full, checkpoint_dir=tmp_path / "b")
    after = _original_state(again.net)
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    variant = again.net.materialize(again.net.space.largest())
    with torch.no_grad():
        torch.testing.assert_close(variant(x), original_out, atol=1e-5, rtol=0)


def test_finetune_original_option_changes_it(tmp_path: Path) -> None:
    config = resolve_config(overrides={**FAST, "finetune_original": True})
    backbone_only = resolve_config(
        overrides={**FAST, "finetune_original": True, "partition_epochs": 0, "distill_epochs": 0, "finetune_epochs": 0}
    )
    before = _original_state(train_supernet_model(backbone_only, checkpoint_dir=tmp_path / "a").net)
    after = _original_state(train_supernet_model(config, checkpoint_dir=tmp_path / "b").net)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_slim_widths_train_a_copy_not_the_original() -> None:
    net = build_supernet("cifar_resnet8", num_classes=10, input_shape=(3, 32, 32))
    net.prepare_alternatives()
    net.freeze_original()
    net.train()
    before = _original_state(net)
    block = net.blocks[0]
    assert block.conv1w is not None
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.5)
    arch = net.space.make(["w50" if "w50" in p.choices else "base" for p in net.space.positions])
    loss = net(torch.randn(8, 3, 32, 32), arch).square().mean()
    loss.backward()
    opt.step()
    after = _original_state(net)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert block.conv1w.weight.grad is not None
    # The original's modules stay in eval mode under net.train().
    assert not block.bn1["base"].training and block.bn1["w50"].training


def test_width_copy_is_importance_sorted_and_original_order_kept() -> None:
    net = build_supernet("cifar_resnet8", num_classes=10, input_shape=(3, 32, 32))
    block = net.blocks[0]
    with torch.no_grad():
        block.bn1["base"].weight.copy_(torch.linspace(0.1, 1.0, block.bn1["base"].weight.numel()))
    original = block.conv1.weight.detach().clone()
    net.prepare_alternatives()
    assert torch.equal(block.conv1.weight, original)
    importance = original.abs().flatten(1).sum(1) * block.bn1["base"].weight.abs()
    order = torch.argsort(importance, descending=True)
    assert torch.equal(block.conv1w.weight, original[order])
    m = block.bn1["w50"].weight.numel()
    assert torch.equal(block.bn1["w50"].weight, block.bn1["base"].weight[order][:m])


def test_freeze_mode_keeps_earlier_partitions_bn_statistics() -> None:
    net = build_supernet("cifar_resnet8", num_classes=10, input_shape=(3, 32, 32))
    net.train()
    stem_bn = next(m for m in net.stem.modules() if isinstance(m, torch.nn.BatchNorm2d))
    before = stem_bn.running_mean.clone()
    phases.freeze_earlier_partitions(net, 1)
    arch = phases.exit_arch(net, 1)
    phases.step_supervised(net, arch, torch.randn(8, 3, 32, 32) * 3 + 1, torch.zeros(8, dtype=torch.long), 0.0)
    assert torch.equal(stem_bn.running_mean, before)
    # and the partition being trained does learn statistics
    block = net.blocks[next(iter(net._stage_positions(1)))]
    assert block.training


def test_trained_artifact_largest_equals_original_modules(tmp_path: Path) -> None:
    from hmt.supernet.train import train_supernet

    out = tmp_path / "sn"
    train_supernet(resolve_config(overrides=FAST), out)
    loaded = load_supernet(out)
    largest = loaded.materialize(loaded.space.largest())  # calibrate=True: the original keeps its statistics
    plain = loaded.net.materialize(loaded.space.largest())
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(largest(x), plain(x), atol=1e-6, rtol=0)
