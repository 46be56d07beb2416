"""The original path stays exact while what elastification added trains; with
finetune_original it moves. Library level, no dataset: fast."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hmt.supernet.elastify.frozen import FrozenBatchNorm
from hmt.supernet.elastify.phases import distill_step, exit_step, finetune_step
from hmt.supernet.elastify.supernet import ElastifiedSupernet, largest_error
from hmt.supernet.train.config import TrainConfig

HERE = Path(__file__).resolve().parent


def _net_1d() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("elastify_models_freeze", HERE / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.net_1d().eval()


def _train_steps(net: ElastifiedSupernet, finetune_original: bool, steps: int = 3) -> None:
    config = TrainConfig(finetune_random_subnets=1)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.5)
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(1)
    net.train()
    for step_fn in (exit_step(net, config), distill_step(net), finetune_step(net, config, finetune_original)):
        for _ in range(steps):
            x = torch.randn(8, 6, 64, generator=generator)
            y = torch.randint(0, 4, (8,), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            step_fn(x, y, rng)
            optimizer.step()
    net.eval()


def test_training_leaves_the_original_exact_and_moves_the_alternatives() -> None:
    model = _net_1d()
    net = ElastifiedSupernet(copy.deepcopy(model), name="n", input_shape=(6, 64))
    base_norms = [m for b in net.blocks for m in b.base.modules() if isinstance(m, FrozenBatchNorm | _BatchNorm)]
    assert base_norms and all(isinstance(m, FrozenBatchNorm) for m in base_norms)
    before = {k: v.clone() for k, v in net.blocks[0].alts["w50"].state_dict().items()}
    _train_steps(net, finetune_original=False)
    assert largest_error(net, model, seed=3) == 0.0  # bit-exact, BN statistics included
    after = net.blocks[0].alts["w50"].state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the alternative did not train"


def test_finetune_original_moves_the_original() -> None:
    model = _net_1d()
    net = ElastifiedSupernet(copy.deepcopy(model), name="n", input_shape=(6, 64))
    net.set_original_frozen(False)
    _train_steps(net, finetune_original=True)
    assert largest_error(net, model, seed=3) > 1e-5



class _OneStage(torch.nn.Module):
    """Every block at the stem's resolution: one stage, whose exit is the model's own head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
        self.body = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU())
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.fc((x + self.body(x)).mean((2, 3)))


def test_a_subnet_of_only_frozen_parts_is_passed_over() -> None:
    """In a one-stage space the largest, and the original with its block skipped, run nothing
    that trains: the fine-tuning step passes them over instead of calling backward on them."""
    torch.manual_seed(0)
    model = _OneStage().eval()
    net = ElastifiedSupernet(copy.deepcopy(model), name="one", input_shape=(3, 16, 16))
    space = net.space
    assert space.num_stages == 1 and "skip" in space.positions[0].choices
    step = finetune_step(net, TrainConfig(), False, fixed=[space.largest(), space.make(["skip"], 0)])
    net.train()
    x, y = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.zeros(4, dtype=torch.long)
    assert float(step(x, y, np.random.default_rng(0))) == 0.0
    net.eval()
    assert largest_error(net, model, seed=3) == 0.0
