"""The guard that decides whether an adapted variant replaces the one serving (no torch).

An adapted model is used only when (1) its mean prediction entropy on the recent
unlabelled inputs is lower than the current model's by at least ``min_entropy_gain``
nats, and (2) on a small labelled canary set, when the user gives one, its accuracy is
not lower than the current model's by more than ``canary_tolerance``. Entropy is what
TENT minimises, so (1) alone can accept a model that became confidently wrong; (2) is the
check against that, and the reason a canary set is worth its few labels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hmt.errors import UsageError


def entropy_np(logits: np.ndarray) -> np.ndarray:
    """Per-sample prediction entropy (nats) of logits (N, classes), numerically stable."""
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return np.asarray(-(np.exp(log_p) * log_p).sum(axis=1))


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    if len(labels) == 0:
        raise UsageError("accuracy of an empty set")
    return float((logits.argmax(axis=1) == labels).mean())


@dataclass(frozen=True)
class GuardPolicy:
    min_entropy_gain: float = 0.0  # nats the mean entropy must drop by (strictly more than)
    canary_tolerance: float = 0.0  # accuracy (0..1) the canary set may lose
    # False: a canary set alone decides. Measured on CIFAR-10 Gaussian noise (severity 5),
    # BN re-estimation doubled accuracy (22% -> 50%) while the mean entropy rose, because
    # the source model was confidently wrong; the entropy rule refuses such a model.
    require_entropy_drop: bool = True

    def __post_init__(self) -> None:
        if self.min_entropy_gain < 0 or not 0 <= self.canary_tolerance <= 1:
            raise UsageError(f"guard policy out of range: {self}")


@dataclass(frozen=True)
class GuardDecision:
    accepted: bool
    reason: str
    entropy_before: float
    entropy_after: float
    canary_accuracy_before: float | None = None
    canary_accuracy_after: float | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(
    *,
    recent_logits_before: np.ndarray,
    recent_logits_after: np.ndarray,
    canary_logits_before: np.ndarray | None = None,
    canary_logits_after: np.ndarray | None = None,
    canary_labels: np.ndarray | None = None,
    policy: GuardPolicy = GuardPolicy(),
) -> GuardDecision:
    """Accept or refuse an adapted model from its outputs and the current model's."""
    h_before = float(entropy_np(recent_logits_before).mean())
    h_after = float(entropy_np(recent_logits_after).mean())
    canary = None
    if canary_labels is not None:
        if canary_logits_before is None or canary_logits_after is None:
            raise UsageError("a canary set needs the logits of both models on it")
        canary = (accuracy(canary_logits_before, canary_labels), accuracy(canary_logits_after, canary_labels))

    def verdict(accepted: bool, reason: str) -> GuardDecision:
        return GuardDecision(accepted, reason, h_before, h_after,
                             canary[0] if canary else None, canary[1] if canary else None)

    if not policy.require_entropy_drop and canary is None:
        raise UsageError("a guard without the entropy rule needs a labelled canary set")
    if policy.require_entropy_drop and not h_before - h_after > policy.min_entropy_gain:
        return verdict(False, f"mean entropy {h_before:.4f} -> {h_after:.4f} nats did not improve by more "
                       f"than {policy.min_entropy_gain}")
    if canary is not None and canary[1] < canary[0] - policy.canary_tolerance:
        return verdict(False, f"canary accuracy fell {canary[0]:.4f} -> {canary[1]:.4f} "
                       f"(tolerance {policy.canary_tolerance})")
    what = f"; canary accuracy {canary[0]:.4f} -> {canary[1]:.4f}" if canary else ""
    return verdict(True, f"mean entropy {h_before:.4f} -> {h_after:.4f} nats{what}")
