"""The memory-saving training engine of the TENT path (CrowdHMTware III-C2): one step of
forward, backward and update with the techniques of :mod:`hmt.adapt.memory` switched on by
:class:`EngineOptions` (8-bit saved activations, recomputation under a budget, each
parameter updated as soon as its gradient is complete)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hmt.adapt.memory import (
    CheckpointPlan,
    Int8SavedTensors,
    Runs,
    SavedTensorMeter,
    as_chain,
    pin_mmap_threshold,
    plan_checkpoints,
    run_chain,
)


@dataclass(frozen=True)
class EngineOptions:
    """What the engine does. All off is plain autograd with one optimizer step at the end."""

    compress: bool = True
    budget_bytes: int | None = None  # None: no recomputation
    update_in_backward: bool = True
    # On a CPU with glibc: freed activation blocks go back to the system (pin_mmap_threshold),
    # so the resident peak follows what the engine keeps. Set when compressing or recomputing.
    return_freed_memory: bool = True


OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class TrainingEngine:
    """Forward + backward + update of ``params`` for a loss over the chain's exit logits.

    ``step(x, loss_fn)`` returns the exit logits of the forward pass (detached). The
    checkpoint plan is made on the first batch and remade when the batch shape changes.
    """

    def __init__(self, model: nn.Module, params: Sequence[nn.Parameter], make_optimizer: OptimizerFactory,
                 options: EngineOptions = EngineOptions()) -> None:
        self.model = model
        self.chain = as_chain(model)
        self.params = list(params)
        self.options = options
        self.plan: CheckpointPlan | None = None
        self.meter: SavedTensorMeter | None = None  # set to count what autograd keeps (benchmarks)
        self._plan_shape: tuple[int, ...] | None = None
        self._exclude = [*model.parameters(), *model.buffers()]
        self._hooks: list[Any] = []
        saving = options.compress or options.budget_bytes is not None
        on_cpu = all(p.device.type == "cpu" for p in self.params)
        self.mmap_pinned = bool(saving and on_cpu and options.return_freed_memory and pin_mmap_threshold())
        if options.update_in_backward:
            # One optimizer per parameter, stepped the moment its gradient is complete.
            self._optimizers = [make_optimizer([p]) for p in self.params]
            for p, opt in zip(self.params, self._optimizers, strict=True):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._step_hook(opt)))
        else:
            self._optimizers = [make_optimizer(self.params)]

    @staticmethod
    def _step_hook(opt: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            opt.step()
            opt.zero_grad(set_to_none=True)

        return hook

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def _ensure_plan(self, x: torch.Tensor) -> Runs:
        if self.options.budget_bytes is None:
            return ()
        if self.plan is None or self._plan_shape != tuple(x.shape):
            self.plan = plan_checkpoints(self.chain, x, self.options.budget_bytes,
                                         compress=self.options.compress, exclude=self._exclude)
            self._plan_shape = tuple(x.shape)
        return self.plan.runs

    def step(self, x: torch.Tensor, loss_fn: Callable[[list[torch.Tensor]], torch.Tensor]) -> list[torch.Tensor]:
        chosen = self._ensure_plan(x)
        meter = self.meter
        with torch.enable_grad():
            if self.options.compress or meter is not None:
                with Int8SavedTensors(self._exclude, compress=self.options.compress, meter=meter):
                    logits = run_chain(self.chain, x, chosen, compress=self.options.compress, meter=meter)
            else:
                logits = run_chain(self.chain, x, chosen)
            loss = loss_fn(logits)
            loss.backward()
            del loss
        if not self.options.update_in_backward:
            self._optimizers[0].step()
            self._optimizers[0].zero_grad(set_to_none=True)
        return [t.detach() for t in logits]
