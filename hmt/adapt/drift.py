"""Drift detection from input statistics alone (no labels, no torch).

Each input image is summarised by per-channel mean, standard deviation and mean absolute
gradient between neighbouring pixels (the last moves with blur and noise, which barely
move the first two). The reference is the mean and spread of these features on source
data (e.g. the supernet's calibration set). A window of recent inputs drifts when the
largest standardised distance |mean_window - mean_ref| / std_ref over the features
passes ``enter``; the drift has passed when the score of the most recent ``leave_window``
inputs falls below ``leave`` (hysteresis, so a window on the edge does not flap). A
normalised input changes the features by a per-channel affine map, which the standardised
distance ignores: raw or normalised inputs give the same score as long as reference and
window are in the same units.

Defaults, from windows of CIFAR-10 test images against a reference of 2,000 others
(benchmarks/adapt/results/drift_scores.json): clean windows of 256 score 0.04-0.14, of 64 up to 0.32;
noise, blur, brightness and contrast at severities 3 and 5 score 0.9-3.9 (JPEG 0.2-0.6).
Drift enters when the whole window (256) passes 0.5 and leaves when its most recent
quarter (64) falls below 0.35; the window then starts afresh.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.errors import UsageError


def input_features(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) or (N, C, L) -> (N, 3C) features: channel mean, std, mean |gradient|."""
    if x.ndim < 3:
        raise UsageError(f"drift features need (N, C, ...) inputs, got shape {x.shape}")
    v = x.astype(np.float32).reshape(x.shape[0], x.shape[1], *x.shape[2:])
    axes = tuple(range(2, v.ndim))
    grads = [np.abs(np.diff(v, axis=a)).mean(axis=axes) for a in axes]
    return np.concatenate([v.mean(axis=axes), v.std(axis=axes), np.mean(grads, axis=0)], axis=1)


@dataclass(frozen=True)
class DriftReference:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def from_inputs(cls, x: np.ndarray) -> DriftReference:
        f = input_features(x)
        return cls(f.mean(axis=0), np.maximum(f.std(axis=0), 1e-6))

    def score(self, features: np.ndarray) -> float:
        """The largest standardised distance of the window's mean feature from the reference."""
        return float(np.max(np.abs(features.mean(axis=0) - self.mean) / self.std))

    def to_json_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> DriftReference:
        return cls(np.asarray(data["mean"], np.float64), np.asarray(data["std"], np.float64))


@dataclass(frozen=True)
class DriftEvent:
    kind: str  # "drift-start" | "drift-end"
    score: float
    seen: int  # inputs seen when it fired


class DriftMonitor:
    """Feed batches; ``update`` returns an event when the state changes."""

    def __init__(self, reference: DriftReference, *, window: int = 256, enter: float = 0.5,
                 leave: float = 0.35, leave_window: int | None = None) -> None:
        if not 0 < leave < enter:
            raise UsageError(f"drift thresholds need 0 < leave < enter, got leave {leave}, enter {enter}")
        if window < 8:
            raise UsageError(f"drift window must hold at least 8 inputs, got {window}")
        self.reference = reference
        # Leaving is judged on the most recent part of the window: an adapted variant serving
        # inputs that are clean again costs accuracy for as long as the reset lags (measured:
        # a full 256-input window cost 5-13 points over the next 1,000 clean images).
        self.leave_window = leave_window if leave_window is not None else max(min(window, 32), window // 4)
        if not 8 <= self.leave_window <= window:
            raise UsageError(f"drift leave window must be in 8..{window}, got {self.leave_window}")
        self.enter = enter
        self.leave = leave
        self._window: deque[np.ndarray] = deque(maxlen=window)
        self.drifting = False
        self.score = 0.0
        self.seen = 0

    def update(self, x: np.ndarray) -> DriftEvent | None:
        for row in input_features(x):
            self._window.append(row)
        self.seen += x.shape[0]
        if len(self._window) < self._window.maxlen:  # type: ignore[operator]
            return None
        self.score = self.reference.score(np.stack(self._window))
        if not self.drifting and self.score > self.enter:
            self.drifting = True
            return DriftEvent("drift-start", self.score, self.seen)
        if self.drifting:
            recent = self.reference.score(np.stack(list(self._window)[-self.leave_window:]))
            if recent < self.leave:
                self.drifting = False
                self.score = recent
                # Start a fresh window: the drifted inputs still in it would re-enter at once.
                self._window.clear()
                return DriftEvent("drift-end", recent, self.seen)
        return None
