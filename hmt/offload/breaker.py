"""Circuit breaker with exponential backoff for the peer (no torch, no I/O: the caller does it).

``closed``: requests may go to the peer. A failure (refused, reset, timed out, a 5xx or
429, or an answer past the request's share of the deadline) opens it: the peer is not
used until ``retry_at_s``, which doubles from ``base_backoff_s`` up to ``max_backoff_s``
with +-``jitter`` (from the generator passed in). Then ``half_open``: one probe or one
request may try; success closes it and resets the backoff, failure opens it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from hmt.errors import UsageError

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, clock: Callable[[], float], rng: np.random.Generator, *, failures_to_open: int = 1,
                 base_backoff_s: float = 0.25, max_backoff_s: float = 2.0, jitter: float = 0.2) -> None:
        if failures_to_open < 1 or not 0 < base_backoff_s <= max_backoff_s or not 0 <= jitter < 1:
            raise UsageError("breaker needs failures_to_open >= 1, 0 < base_backoff_s <= max_backoff_s, "
                             "0 <= jitter < 1")
        self.clock = clock
        self.rng = rng
        self.failures_to_open = failures_to_open
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.jitter = jitter
        self.state = CLOSED
        self.failures = 0
        self.opens = 0
        self.backoff_s = base_backoff_s
        self.retry_at_s = 0.0
        self.last_error: str | None = None
        self._trial = False
        self._lock = threading.Lock()

    def allow(self) -> bool:
        """Whether a request may go to the peer now (in half-open, only one at a time)."""
        with self._lock:
            if self.state == CLOSED:
                return True
            if self.state == OPEN and self.clock() >= self.retry_at_s:
                self.state = HALF_OPEN
                self._trial = False
            if self.state == HALF_OPEN and not self._trial:
                self._trial = True
                return True
            return False

    def success(self) -> None:
        with self._lock:
            self.state = CLOSED
            self.failures = 0
            self.backoff_s = self.base_backoff_s
            self._trial = False

    def failure(self, reason: str) -> None:
        with self._lock:
            self.last_error = reason
            self.failures += 1
            if self.state == HALF_OPEN or self.failures >= self.failures_to_open:
                if self.state != OPEN:
                    self.opens += 1
                spread = 1.0 + self.jitter * float(self.rng.uniform(-1.0, 1.0))
                self.retry_at_s = self.clock() + self.backoff_s * spread
                self.backoff_s = min(self.max_backoff_s, 2.0 * self.backoff_s)
                self.state = OPEN
                self._trial = False

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {"state": self.state, "failures": self.failures, "opens": self.opens,
                    "backoff_s": self.backoff_s, "retry_in_s": max(0.0, self.retry_at_s - self.clock()),
                    "last_error": self.last_error}
