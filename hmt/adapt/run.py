"""Offline adaptation runs: adapt a model to each set of a stream, measure, guard, keep.

``adapt_sets`` is what ``hmt adapt`` and ``benchmarks/adapt/shift.py`` call. For each set of
images (a corruption, or clean data) it measures the source model, adapts a copy to the
set's unlabelled images (BN re-estimation, or TENT online over the batches), measures the
adapted variant on the same images (the usual test-time-adaptation protocol: the data it
adapts to is the data it serves), and asks the guard whether the variant may serve.
The model passed in is never modified.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hmt.adapt.engine import EngineOptions
from hmt.adapt.guard import GuardPolicy, accuracy, decide, entropy_np
from hmt.adapt.memory import peak_bytes
from hmt.adapt.tent import TentAdapter, TentOptions, recalibrate_bn
from hmt.errors import UsageError
from hmt.progress import ProgressCallback, no_progress

METHODS = ("bn", "tent")


@dataclass(frozen=True)
class AdaptOptions:
    method: str = "tent"
    batch_size: int = 128
    tent: TentOptions = field(default_factory=TentOptions)
    guard: GuardPolicy = field(default_factory=GuardPolicy)
    canary_size: int = 0  # labelled images per set held out of the stream as the canary
    # The stream's order is shuffled with this seed: sets are stored sorted by class, and
    # single-class batches give BN batch statistics that fit no other class (measured:
    # TENT's online accuracy on clean CIFAR-10 fell from 79% to 24%).
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"adaptation method must be one of {METHODS}, got {self.method!r}")
        if self.batch_size < 2:
            raise UsageError(f"adaptation needs batches of at least 2 images, got {self.batch_size}")
        if self.canary_size < 0:
            raise UsageError(f"canary size must be >= 0, got {self.canary_size}")


@dataclass(frozen=True)
class SetResult:
    name: str
    images: int
    accuracy_before: float
    accuracy_after: float
    accuracy_online: float | None  # TENT: predictions made while adapting, batch by batch
    entropy_before: float
    entropy_after: float
    adapt_ms_per_batch: float
    accepted: bool
    reason: str
    canary_accuracy_before: float | None
    canary_accuracy_after: float | None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalize(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 tensor normalised per channel, as in training."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    m = np.asarray(mean, np.float32).reshape(shape)
    s = np.asarray(std, np.float32).reshape(shape)
    return torch.from_numpy((x.astype(np.float32) / 255.0 - m) / s)


def batches_of(x: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    return [x[i:i + batch_size] for i in range(0, len(x), batch_size)]


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 500) -> np.ndarray:
    model.eval()
    return torch.cat([model(b) for b in batches_of(x, batch_size)]).cpu().numpy()


def balanced_split(labels: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(held-out indices, the rest): ``count`` images spread over the classes, first ones first."""
    if count == 0:
        return np.zeros(0, np.int64), np.arange(len(labels))
    classes = np.unique(labels)
    per_class = max(1, count // len(classes))
    held = np.sort(np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in classes]))
    rest = np.setdiff1d(np.arange(len(labels)), held)
    return held, rest


def adapt_once(model: nn.Module, stream: list[torch.Tensor], options: AdaptOptions) \
        -> tuple[nn.Module, float, np.ndarray | None]:
    """(adapted eval-mode variant, ms per batch, TENT's online logits or None)."""
    def sync() -> None:  # CUDA runs asynchronously: time what the device did, not what was queued
        if stream[0].device.type == "cuda":
            torch.cuda.synchronize(stream[0].device)

    sync()
    start = time.perf_counter()
    if options.method == "bn":
        variant = copy.deepcopy(model)
        recalibrate_bn(variant, stream)
        variant.eval()
        sync()
        return variant, (time.perf_counter() - start) * 1e3 / len(stream), None
    adapter = TentAdapter(model, options.tent)
    online = [adapter.step(b).logits.cpu().numpy() for b in stream]
    sync()
    elapsed = time.perf_counter() - start
    variant = adapter.adapted_variant(stream)
    adapter.close()
    return variant, elapsed * 1e3 / len(stream), np.concatenate(online)


def adapt_set(model: nn.Module, name: str, x: torch.Tensor, y: np.ndarray,
              options: AdaptOptions) -> tuple[SetResult, nn.Module]:
    """Adapt a copy of ``model`` to one set: its result and the adapted variant."""
    held, rest = balanced_split(y, options.canary_size)
    rest = np.random.default_rng(options.seed).permutation(rest)
    # Index tensors on the data's device (a CUDA tensor cannot be indexed by a numpy array).
    rest_t = torch.as_tensor(rest, device=x.device)
    held_t = torch.as_tensor(held, device=x.device)
    stream_x, stream_y = x[rest_t], y[rest]
    stream = batches_of(stream_x, options.batch_size)
    if len(stream[-1]) < 2:
        stream = stream[:-1]  # a batch of one has no batch statistics
    before = predict(model, stream_x)
    variant, ms, online = adapt_once(model, stream, options)
    after = predict(variant, stream_x)
    canary: dict[str, Any] = {}
    if len(held):
        canary = {"canary_logits_before": predict(model, x[held_t]), "canary_logits_after": predict(variant, x[held_t]),
                  "canary_labels": y[held]}
    decision = decide(recent_logits_before=before, recent_logits_after=after, policy=options.guard, **canary)
    seen = sum(len(b) for b in stream)
    return SetResult(
        name=name, images=len(stream_y), accuracy_before=accuracy(before, stream_y),
        accuracy_after=accuracy(after, stream_y),
        accuracy_online=accuracy(online, stream_y[:seen]) if online is not None else None,
        entropy_before=float(entropy_np(before).mean()), entropy_after=float(entropy_np(after).mean()),
        adapt_ms_per_batch=ms, accepted=decision.accepted, reason=decision.reason,
        canary_accuracy_before=decision.canary_accuracy_before, canary_accuracy_after=decision.canary_accuracy_after,
    ), variant


def adapt_sets(model: nn.Module, sets: dict[str, tuple[torch.Tensor, np.ndarray]], options: AdaptOptions, *,
               progress: ProgressCallback = no_progress) -> tuple[list[SetResult], dict[str, nn.Module]]:
    """Adapt a fresh copy of ``model`` to each set; (results, accepted variants by set name)."""
    results: list[SetResult] = []
    variants: dict[str, nn.Module] = {}
    for k, (name, (x, y)) in enumerate(sets.items()):
        result, variant = adapt_set(model, name, x, y, options)
        results.append(result)
        if result.accepted:
            variants[name] = variant
        progress("adapt", k + 1, len(sets), f"{name}: {result.accuracy_before:.3f} -> {result.accuracy_after:.3f}")
    return results, variants


def training_peak_bytes(model: nn.Module, batch: torch.Tensor, engine: EngineOptions,
                        tent: TentOptions | None = None) -> int:
    """Measured peak bytes of one TENT step (after one unmeasured step that plans recomputation)."""
    import dataclasses

    options = dataclasses.replace(tent or TentOptions(), engine=engine)
    adapter = TentAdapter(model, options)
    adapter.step(batch)
    peak = peak_bytes(lambda: adapter.step(batch), device=batch.device)
    adapter.close()
    return peak
