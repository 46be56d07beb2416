"""Device load index (AdaScale eq. 2) and a short autoregressive forecast of it (AdaScale IV-A).

``I = (Wcpu*Ucpu + Wgpu*Ugpu + Wm*Um) / W`` with ``W`` the sum of the weights of the
resources present: on a device without a GPU reading the GPU term and its weight drop
out, so ``I`` stays in 0..1.

The forecast fits AR(p) with an intercept by least squares on a sliding window,
``x_t = c + phi_1 x_{t-1} + ... + phi_p x_{t-p}``, and iterates it ``horizon`` steps.
With fewer than ``min_history`` points it repeats the last value. Forecasts are clipped
to 0..1 (the index is a share), which also keeps an unstable fit from running away.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hmt.compat import strict_zip
from hmt.errors import UsageError
from hmt.runtime.settings import LoadWeights
from hmt.serve.deciding.monitor import ResourceSample


def load_index(
    cpu_util: float, mem_util: float, gpu_util: float | None = None, weights: LoadWeights | None = None
) -> float:
    """Eq. 2 over utilisations in 0..1 (clipped); ``gpu_util=None`` drops the GPU term and weight."""
    w = weights if weights is not None else LoadWeights()
    total = w.cpu * _unit(cpu_util) + w.memory * _unit(mem_util)
    weight_sum = w.cpu + w.memory
    if gpu_util is not None:
        total += w.gpu * _unit(gpu_util)
        weight_sum += w.gpu
    if weight_sum <= 0:
        raise UsageError("load weights of the resources present are all zero (no GPU reading and cpu = memory = 0)")
    return total / weight_sum


def load_index_of(sample: ResourceSample, weights: LoadWeights | None = None) -> float:
    """Eq. 2 of one monitor sample."""
    return load_index(sample.cpu_util, sample.mem_util, sample.gpu_util, weights)


def _unit(value: float) -> float:
    if not math.isfinite(value):
        raise UsageError(f"utilisation must be finite, got {value}")
    return min(1.0, max(0.0, float(value)))


@dataclass(frozen=True)
class ARModel:
    """A fitted AR(p): ``x_t = intercept + sum_k coefficients[k] * x_{t-1-k}`` (lag 1 first)."""

    intercept: float
    coefficients: tuple[float, ...]

    @property
    def order(self) -> int:
        return len(self.coefficients)

    def forecast(self, recent: Sequence[float], horizon: int) -> np.ndarray:
        """Iterate the model ``horizon`` steps after ``recent`` (oldest first, at least ``order`` values)."""
        if horizon < 1:
            raise UsageError(f"forecast horizon must be >= 1, got {horizon}")
        p = self.order
        if len(recent) < p:
            raise UsageError(f"AR({p}) forecast needs {p} recent values, got {len(recent)}")
        lags = [float(v) for v in recent[len(recent) - p :]][::-1] if p else []  # lag 1 first
        out = np.empty(horizon, dtype=np.float64)
        for step in range(horizon):
            value = self.intercept + sum(c * x for c, x in strict_zip(self.coefficients, lags))
            out[step] = value
            if p:
                lags = [value, *lags[:-1]]
        return out


def fit_ar(series: Sequence[float] | np.ndarray, order: int) -> ARModel:
    """Least-squares AR(``order``) with intercept over ``series`` (oldest first).

    Needs at least ``2 * order + 1`` points (``order + 1`` equations for ``order + 1``
    unknowns). A rank-deficient system (e.g. a constant series) gets the minimum-norm
    solution, whose one-step forecast of a constant is that constant.
    """
    if order < 0:
        raise UsageError(f"AR order must be >= 0, got {order}")
    x = np.asarray(series, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise UsageError("AR series must be finite")
    n_rows = x.size - order
    if n_rows < order + 1:
        raise UsageError(f"AR({order}) needs at least {2 * order + 1} points, got {x.size}")
    design = np.empty((n_rows, order + 1), dtype=np.float64)
    design[:, 0] = 1.0
    for k in range(1, order + 1):
        design[:, k] = x[order - k : x.size - k]
    solution, *_ = np.linalg.lstsq(design, x[order:], rcond=None)
    return ARModel(intercept=float(solution[0]), coefficients=tuple(float(c) for c in solution[1:]))


class LoadForecaster:
    """Sliding-window AR forecast of the load index.

    ``update`` appends one value (one per monitor tick); ``forecast(horizon)`` refits on
    the window when it changed and returns ``horizon`` values, the last value repeated
    while the window holds fewer than ``min_history`` points.
    """

    def __init__(self, order: int = 2, window: int = 60, min_history: int | None = None) -> None:
        if order < 0:
            raise UsageError(f"forecast order must be >= 0, got {order}")
        need = 2 * order + 1
        min_history = max(need, 2 * order + 2) if min_history is None else min_history
        if min_history < need:
            raise UsageError(f"forecast min_history must be >= {need} for AR({order}), got {min_history}")
        if window < min_history:
            raise UsageError(f"forecast window ({window}) must be >= min_history ({min_history})")
        self.order = order
        self.min_history = min_history
        self._values: deque[float] = deque(maxlen=window)
        self._model: ARModel | None = None
        self._stale = True

    def __len__(self) -> int:
        return len(self._values)

    def update(self, value: float) -> None:
        if not math.isfinite(value):
            raise UsageError(f"load index must be finite, got {value}")
        self._values.append(float(value))
        self._stale = True

    @property
    def model(self) -> ARModel | None:
        """The AR fit of the current window, or ``None`` with too little history."""
        if self._stale:
            self._model = fit_ar(list(self._values), self.order) if len(self._values) >= self.min_history else None
            self._stale = False
        return self._model

    def forecast(self, horizon: int = 1) -> np.ndarray:
        if horizon < 1:
            raise UsageError(f"forecast horizon must be >= 1, got {horizon}")
        if not self._values:
            raise UsageError("no load history to forecast from")
        model = self.model
        if model is None:
            return np.full(horizon, self._values[-1])
        out = model.forecast(list(self._values), horizon)
        if not np.all(np.isfinite(out)):
            return np.full(horizon, self._values[-1])
        return np.clip(out, 0.0, 1.0)
