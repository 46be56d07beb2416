"""A first Ctrl-C during elastification lets the epoch end, writes the checkpoint and interrupts, so
the rerun resumes after that epoch; a second Ctrl-C interrupts at once."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from hmt.supernet.elastify import epochs as epochs_module
from hmt.supernet.elastify.epochs import EpochResume, run_epochs
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.distributed import DistContext

BATCHES = 4


class _Loader:
    """Four batches of a fixed tensor (a fake inside a unit test)."""

    def __len__(self) -> int:
        return BATCHES

    def __iter__(self) -> Any:
        return iter([(torch.ones(2, 3), torch.zeros(2, dtype=torch.long))] * BATCHES)

    def set_epoch(self, epoch: int) -> None:
        pass


@dataclass
class _Records:
    saved: list[tuple[str, int]] = field(default_factory=list)  # checkpoints: (phase, epochs done)
    steps: int = 0
    notes: list[str] = field(default_factory=list)


def _run(records: _Records, sigints_at_step: dict[int, int], epochs: int = 5, forget: bool = True,
         ctx: DistContext | None = None) -> None:
    """run_epochs on a linear model, sending SIGINTs to this process during the given steps; ``forget``:
    clear a stop request left over afterwards; ``ctx``: the distributed context train-supernet passes."""
    model = torch.nn.Linear(3, 2)

    def step(xb: torch.Tensor, yb: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        for _ in range(sigints_at_step.get(records.steps, 0)):
            os.kill(os.getpid(), signal.SIGINT)
        records.steps += 1
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        return loss

    resume = EpochResume("finetune", 0, None, lambda phase, done, state: records.saved.append((phase, done)),
                         every_s=1e9)
    try:
        run_epochs("finetune", epochs, 0.1, list(model.parameters()), step, _Loader(),  # type: ignore[arg-type]
                   TrainConfig(), [], lambda *a: records.notes.append(str(a[-1])), weight_decay=0.0,
                   autocast=False, device=torch.device("cpu"), seed_word=1, resume=resume, ctx=ctx)
    finally:
        if forget:
            epochs_module._StopRequest.requested = False


def test_a_first_ctrl_c_ends_the_epoch_writes_the_checkpoint_then_interrupts() -> None:
    before = signal.getsignal(signal.SIGINT)
    records = _Records()
    with pytest.raises(KeyboardInterrupt):
        _run(records, {BATCHES + 1: 1})  # during the second epoch
    assert records.saved == [("finetune", 2)] and records.steps == 2 * BATCHES  # that epoch ran to its end
    assert any(epochs_module.STOPPING_NOTE in n for n in records.notes)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_a_single_process_context_still_ends_the_epoch_on_a_first_ctrl_c() -> None:
    # train-supernet passes the context of one process (world size 1), not None: a first Ctrl-C there
    # interrupted at once, losing the epoch, where it must end it and write the checkpoint.
    records = _Records()
    with pytest.raises(KeyboardInterrupt):
        _run(records, {BATCHES + 1: 1}, ctx=DistContext(0, 1, 0))
    assert records.saved == [("finetune", 2)] and records.steps == 2 * BATCHES


def test_a_second_ctrl_c_interrupts_at_once_and_no_ctrl_c_runs_every_epoch() -> None:
    records = _Records()
    with pytest.raises(KeyboardInterrupt):
        _run(records, {BATCHES + 1: 2})
    assert records.saved == [] and records.steps == BATCHES + 1  # stopped inside the step it came in
    quiet = _Records()
    _run(quiet, {})
    assert quiet.saved == [] and quiet.steps == 5 * BATCHES  # the interval was never reached


def test_a_ctrl_c_in_a_phases_last_epoch_stops_at_the_next_phases_start() -> None:
    records = _Records()
    _run(records, {BATCHES: 1}, epochs=2)  # the last epoch: the phase ends, its caller writes its checkpoint
    assert records.steps == 2 * BATCHES and records.saved == []
    epochs_module._StopRequest.requested = True
    with pytest.raises(KeyboardInterrupt):
        _run(_Records(), {})
    assert not epochs_module._StopRequest.requested


def test_a_ctrl_c_in_the_last_phases_last_epoch_stops_after_training_and_is_then_forgotten() -> None:
    records = _Records()
    try:
        _run(records, {BATCHES: 1}, epochs=2, forget=False)  # during the last of two epochs
        assert records.steps == 2 * BATCHES  # the phase ran to its end (its caller writes its checkpoint)
        with pytest.raises(KeyboardInterrupt):
            epochs_module.stop_if_requested_after_training()
        assert not epochs_module._StopRequest.requested
        epochs_module.stop_if_requested_after_training()  # nothing asked: nothing raised
    finally:
        epochs_module._StopRequest.requested = False
