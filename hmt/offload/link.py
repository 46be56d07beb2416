"""What the link to the peer costs now: round-trip time and milliseconds per byte (no torch).

Two sources, both real transfers:

- passive: every segment request gives ``network_ms = round trip - the device's own time
  (its CPU and wait for its core) - the peer's server time`` for a known number of bytes
  (:mod:`hmt.offload.timing`; the device subtracts both before it calls this);
- active: when the link has been idle for a while, the device sends a small ``GET
  /v1/status`` (round-trip time, and the peer's load) and a ``POST /v1/probe`` of a few
  KiB (bytes over time).

The model is ``transfer_ms(b) = rtt_ms + b * ms_per_byte``. The RTT is the smallest of the
last ``rtt_window`` round trips (as BBR keeps its min_rtt): on a shared machine a round trip
is only ever inflated by scheduling noise, never shortened, and a link that really got
slower shows up at once in the per-byte cost of the next transfer. The cost per byte is tracked
rather than the bandwidth because a fast link sends a small tensor in "no time": a
bandwidth estimate from that divides by ~0 and swings wildly, a per-byte cost of ~0 does
not. Both are exponential moving averages; two samples in a row far above the estimate
(``jump_factor``: the link got worse) replace it at once, so the device leaves a slow link
within two requests instead of a dozen, while one outlier alone (scheduling noise the
device's accounting cannot see, such as a wait for the GIL) is clipped to ``jump_factor``
times the estimate before it is smoothed in.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from hmt.errors import UsageError


@dataclass(frozen=True)
class LinkEstimate:
    rtt_ms: float
    ms_per_byte: float
    samples: int
    age_s: float  # since the last sample

    @property
    def bandwidth_mbit_s(self) -> float:
        return math.inf if self.ms_per_byte <= 0 else 8e-3 / self.ms_per_byte

    def transfer_ms(self, size_bytes: int) -> float:
        return self.rtt_ms + size_bytes * self.ms_per_byte


class LinkEstimator:
    """Thread-safe smoothed RTT and per-byte cost (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], *, smoothing: float = 0.3, jump_factor: float = 2.0,
                 initial_rtt_ms: float = 1.0, initial_ms_per_byte: float = 8e-5, rtt_window: int = 5) -> None:
        if not 0 < smoothing <= 1 or jump_factor < 1:
            raise UsageError(f"link smoothing must be in (0, 1] and jump_factor >= 1, got {smoothing}, {jump_factor}")
        self.clock = clock
        self.smoothing = smoothing
        self.jump_factor = jump_factor
        self._rtt_ms = initial_rtt_ms
        self._rtts: deque[float] = deque(maxlen=max(1, rtt_window))
        self._ms_per_byte = initial_ms_per_byte  # 100 Mbit/s until measured
        self._samples = 0
        self._high = 0  # consecutive per-byte samples far above the estimate
        self._last_s = clock()
        self._lock = threading.Lock()

    def _blend(self, old: float, new: float) -> float:
        if self._samples == 0:
            return new
        if new > self.jump_factor * old:
            self._high += 1
            if self._high >= 2:
                return new
            new = self.jump_factor * old  # unconfirmed: clipped, so one stall moves it by 30% at most
        else:
            self._high = 0
        return old + self.smoothing * (new - old)

    def observe_rtt(self, rtt_ms: float) -> None:
        """A round trip that carried (almost) no payload."""
        if not (math.isfinite(rtt_ms) and rtt_ms >= 0):
            return
        with self._lock:
            self._rtts.append(rtt_ms)
            self._rtt_ms = min(self._rtts)
            self._samples += 1
            self._last_s = self.clock()

    def observe_transfer(self, size_bytes: int, network_ms: float) -> None:
        """A round trip of ``size_bytes`` payload whose time on the network was ``network_ms``."""
        if size_bytes <= 0 or not (math.isfinite(network_ms) and network_ms >= 0):
            return
        with self._lock:
            if network_ms < self._rtt_ms:
                # Faster than the RTT we believe: the RTT fell (a better link); no per-byte cost seen.
                self._rtts.append(network_ms)
                self._rtt_ms = min(self._rtts)
                per_byte = 0.0
            else:
                per_byte = (network_ms - self._rtt_ms) / size_bytes
            self._ms_per_byte = self._blend(self._ms_per_byte, per_byte)
            self._samples += 1
            self._last_s = self.clock()

    def estimate(self) -> LinkEstimate:
        with self._lock:
            return LinkEstimate(self._rtt_ms, self._ms_per_byte, self._samples, self.clock() - self._last_s)
