"""The epoch loop of elastification's phases: SGD with the trainer's one-cycle schedule, one
history record per epoch, and checkpoints between epochs so a killed phase resumes where it stood.

A first Ctrl-C (SIGINT) during a phase's epoch lets the epoch end, writes the checkpoint and then
interrupts (KeyboardInterrupt): nothing is lost, and the resumed run repeats the uninterrupted one.
A second Ctrl-C interrupts at once, back to the last checkpoint (at most ``every_s`` behind)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from hmt.data import BatchLoader
from hmt.progress import ProgressCallback
from hmt.supernet.train.config import TrainConfig
from hmt.supernet.train.distributed import DistContext, all_reduce_gradients

ELASTIC_PHASES = ("exits", "distill", "distill_fresh", "finetune")


def to_cpu(value: Any) -> Any:
    """An optimizer's state dict with its tensors on the CPU (what a checkpoint holds)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cpu(v) for v in value]
    return value


class EpochResume:
    """Where a phase stands within its epochs, for a checkpoint every ``every_s`` seconds (a
    supernet's weights can be 100+ MB: one per epoch would cost more than the epoch) and for a
    resume after a kill. ``save`` writes the checkpoint (a phase's last epoch is the phase's own
    checkpoint); ``ran`` counts the epochs of this invocation over every phase, and once it reaches
    ``stop_after_epochs`` (tests) the next checkpoint inside a phase raises TrainingInterrupted."""

    def __init__(self, phase: str, epoch: int, optimizer_state: dict[str, Any] | None,
                 save: Callable[[str, int, dict[str, Any]], None], *, every_s: float = 120.0,
                 stop_after_epochs: int | None = None, ran: list[int] | None = None) -> None:
        self.phase, self.epoch, self.optimizer_state = phase, epoch, optimizer_state or {}
        self._save, self.every_s, self._stop = save, every_s, stop_after_epochs
        self._ran = ran if ran is not None else [0]
        self._last = time.monotonic()

    def save_now(self, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        """The checkpoint after ``epoch`` epochs of this phase, now (a requested stop)."""
        self._save(self.phase, epoch, optimizer.state_dict())
        self._last = time.monotonic()

    def epoch_done(self, epoch: int, epochs: int, optimizer: torch.optim.Optimizer) -> None:
        self._ran[0] += 1
        if epoch >= epochs:
            return
        stop = self._stop is not None and self._ran[0] >= self._stop
        if stop or time.monotonic() - self._last >= self.every_s:
            self._save(self.phase, epoch, optimizer.state_dict())
            self._last = time.monotonic()
        if stop:
            from hmt.supernet.train.trainer import TrainingInterrupted

            raise TrainingInterrupted(f"stopped after {self._ran[0]} epochs (checkpoint written)")


STOPPING_NOTE = "stopping after this epoch with a checkpoint (Ctrl-C again: at once)"


class _StopRequest:
    """Whether a Ctrl-C asked elastification to stop at the next epoch's end (process-wide, as the
    signal is): set by the handler :func:`_stop_on_sigint` installs, cleared once acted upon."""

    requested = False


@contextmanager
def _stop_on_sigint(enabled: bool) -> Iterator[None]:
    """While inside: a first SIGINT only sets :class:`_StopRequest`; a second raises KeyboardInterrupt.
    Only in the main thread (where Python runs signal handlers) and where ``enabled``."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if _StopRequest.requested:
            raise KeyboardInterrupt
        _StopRequest.requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _stop_if_requested(resume: EpochResume | None, epoch: int, epochs: int, optimizer: torch.optim.Optimizer) -> None:
    """At an epoch's end: a requested stop writes the checkpoint (the phase's own when it was its
    last epoch: the caller writes it, and the next phase stops at its start) and interrupts."""
    if not _StopRequest.requested or epoch >= epochs:
        return
    if resume is not None:
        resume.save_now(epoch, optimizer)
    _StopRequest.requested = False
    raise KeyboardInterrupt


def stop_if_requested_after_training() -> None:
    """After the last phase (its checkpoint written): a Ctrl-C asked during its last epoch interrupts
    here, before evaluation, rather than being forgotten (no later phase would act on it); the
    request is cleared either way, so it never outlives the run that received it."""
    if _StopRequest.requested:
        _StopRequest.requested = False
        raise KeyboardInterrupt


def run_epochs(
    name: str,
    epochs: int,
    lr: float,
    params: list[nn.Parameter],
    step: Callable[[torch.Tensor, torch.Tensor, np.random.Generator], torch.Tensor],
    loader: BatchLoader,
    config: TrainConfig,
    history: list[dict[str, Any]],
    progress: ProgressCallback,
    *,
    weight_decay: float,
    autocast: bool,
    device: torch.device,
    seed_word: int,
    resume: EpochResume | None = None,
    ctx: DistContext | None = None,
) -> None:
    """SGD (Nesterov) with the trainer's one-cycle schedule; one history record per epoch.
    ``resume`` starts at a checkpointed epoch with its optimizer state and is told after each
    epoch (every draw is seeded by (phase, epoch), so a resumed run repeats the uninterrupted one).
    With ``resume`` in a single process, a first Ctrl-C stops after the epoch (see the module docstring)."""
    if epochs == 0 or not params:
        return
    if _StopRequest.requested:  # asked during the last epoch of the phase before (its checkpoint is written)
        _StopRequest.requested = False
        raise KeyboardInterrupt
    optimizer = torch.optim.SGD(params, lr=lr, momentum=config.momentum, nesterov=True, weight_decay=weight_decay)
    start = 0
    if resume is not None and resume.epoch > 0:
        optimizer.load_state_dict(resume.optimizer_state)
        start = resume.epoch
    total = len(loader) * epochs
    # Single process only: torchrun's ranks would not all stop at the same epoch.
    with _stop_on_sigint(resume is not None and (ctx is None or not ctx.enabled)):
        for epoch in range(start, epochs):
            _one_epoch(name, epoch, epochs, lr, total, params, step, loader, config, optimizer, history, progress,
                       autocast=autocast, device=device, seed_word=seed_word, ctx=ctx)
            if resume is not None:
                resume.epoch_done(epoch + 1, epochs, optimizer)
            _stop_if_requested(resume, epoch + 1, epochs, optimizer)


def _one_epoch(name: str, epoch: int, epochs: int, lr: float, total: int, params: list[nn.Parameter],
               step: Callable[[torch.Tensor, torch.Tensor, np.random.Generator], torch.Tensor], loader: BatchLoader,
               config: TrainConfig, optimizer: torch.optim.Optimizer, history: list[dict[str, Any]],
               progress: ProgressCallback, *, autocast: bool, device: torch.device, seed_word: int,
               ctx: DistContext | None) -> None:
    from hmt.supernet.train.trainer import derive_seed, lr_at

    loader.set_epoch(derive_seed(seed_word, epoch))
    rng = np.random.default_rng(derive_seed(config.seed, 40 + seed_word, epoch))
    started = time.perf_counter()
    loss_sum = torch.zeros((), device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(derive_seed(config.seed, 50 + seed_word, epoch))  # dropout, scoped
        for i, (xb, yb) in enumerate(loader):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(lr, epoch * len(loader) + i, total)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = step(xb, yb, rng)
            if ctx is not None:
                all_reduce_gradients(params, ctx)  # torchrun: the ranks' mean gradient
            optimizer.step()
            loss_sum += loss.detach()
            if i % 10 == 0 or i == len(loader) - 1:
                note = f"; {STOPPING_NOTE}" if _StopRequest.requested else ""
                progress(name, epoch * len(loader) + i + 1, total, f"epoch {epoch + 1}/{epochs}{note}")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    history.append({"phase": name, "epoch": epoch, "train_loss": float(loss_sum) / max(1, len(loader)),
                    "epoch_s": time.perf_counter() - started})
