"""What the HTTP face adds to ``/v1/status``: recent request spans and client-reported latencies
(``/metrics`` has them as histograms, :mod:`hmt.serve.reporting.metrics`)."""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

WINDOW = 2048  # recent values a LatencyWindow keeps


class LatencyWindow:
    """Recent values (ms) and their running count/sum, thread-safe, for status and metrics."""

    def __init__(self, size: int = WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()
        self.count = 0
        self.sum_ms = 0.0

    def add(self, value_ms: float) -> None:
        with self._lock:
            self._values.append(value_ms)
            self.count += 1
            self.sum_ms += value_ms

    def summary(self) -> dict[str, float] | None:
        with self._lock:
            values = np.array(self._values, dtype=np.float64)
            count, total = self.count, self.sum_ms
        if not values.size:
            return None
        return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
                "p99": float(np.percentile(values, 99)), "count": count, "sum": total}
