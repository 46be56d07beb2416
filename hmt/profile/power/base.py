"""What every power source produces, and the pure arithmetic on it.

A source is started before a measurement and stopped after; ``stop()`` returns a
:class:`PowerTrace`: power in watts at host times (``time.time()`` seconds). Energy over a
window is the integral of the trace; a window the trace does not cover is an error, never
a silent zero.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hmt.errors import DeviceError, InputError


@dataclass(frozen=True)
class Window:
    """A stretch of the run: ``runs`` inferences of ``label`` between two host times.

    ``design_row`` is the workload's eq. 1 feature row (used by the fake source only).
    """

    label: str
    t_start: float
    t_end: float
    runs: int
    design_row: tuple[float, ...] = ()

    @property
    def duration_s(self) -> float:
        return self.t_end - self.t_start

    @property
    def is_workload(self) -> bool:
        """A workload's window (energy is fitted on these), not an idle or sync stretch."""
        return self.runs > 0 and not self.label.startswith(("idle", "sync-"))


@dataclass(frozen=True)
class PowerTrace:
    times_s: np.ndarray
    power_w: np.ndarray
    source: str
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.times_s.shape != self.power_w.shape or self.times_s.ndim != 1:
            raise InputError(f"{self.source}: times and power must be 1-D arrays of equal length")
        if self.times_s.size < 2:
            raise InputError(f"{self.source}: a power trace needs at least 2 samples, got {self.times_s.size}")
        if np.any(np.diff(self.times_s) <= 0):
            raise InputError(f"{self.source}: trace times must strictly increase")
        if not np.all(np.isfinite(self.power_w)):
            raise InputError(f"{self.source}: trace has non-finite power values")

    @property
    def t_start(self) -> float:
        return float(self.times_s[0])

    @property
    def t_end(self) -> float:
        return float(self.times_s[-1])

    def shifted(self, offset_s: float) -> PowerTrace:
        return PowerTrace(self.times_s + offset_s, self.power_w, self.source, self.notes)

    def covers(self, t0: float, t1: float, *, slack_s: float = 0.0) -> bool:
        return self.t_start - slack_s <= t0 and t1 <= self.t_end + slack_s

    def energy_j(self, t0: float, t1: float) -> float:
        """Trapezoidal integral of power over [t0, t1]; refuses a window outside the trace."""
        if t1 <= t0:
            raise ValueError(f"empty window [{t0}, {t1}]")
        if not self.covers(t0, t1):
            raise InputError(
                f"{self.source}: the power trace covers {self.t_start:.3f}..{self.t_end:.3f} s but the run "
                f"needs {t0:.3f}..{t1:.3f} s ({max(self.t_start - t0, t1 - self.t_end):.3f} s uncovered); "
                "record the trace over the whole run"
            )
        inside = (self.times_s > t0) & (self.times_s < t1)
        t = np.concatenate(([t0], self.times_s[inside], [t1]))
        p = np.interp(t, self.times_s, self.power_w)
        return float(np.sum((p[1:] + p[:-1]) * np.diff(t)) / 2.0)

    def mean_power_w(self, t0: float, t1: float) -> float:
        return self.energy_j(t0, t1) / (t1 - t0)


def trace_from_cumulative(times_s: Sequence[float], energy_j: Sequence[float], source: str) -> PowerTrace:
    """Power from a cumulative energy counter (RAPL, NVML): dE/dt placed at interval midpoints."""
    t = np.asarray(times_s, float)
    e = np.asarray(energy_j, float)
    if t.size < 3:
        raise DeviceError(f"{source}: only {t.size} counter readings; the window was too short to sample")
    keep = np.concatenate(([True], np.diff(t) > 0))
    t, e = t[keep], e[keep]
    power = np.diff(e) / np.diff(t)
    mid = (t[1:] + t[:-1]) / 2
    # Extend to the first and last reading so windows at the edges stay covered.
    return PowerTrace(np.concatenate(([t[0]], mid, [t[-1]])),
                      np.concatenate(([power[0]], power, [power[-1]])), source)


class PowerSource:
    """Base of every power source. Subclasses set ``name`` and implement start/stop."""

    name = "base"

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> PowerTrace:
        raise NotImplementedError

    def note_window(self, window: Window) -> None:
        """Told of every measured window. Real meters ignore it; the fake source uses it."""

    def describe(self) -> str:
        return self.name


class PollingSource(PowerSource):
    """A source read by polling in a background thread.

    ``read()`` returns watts, or joules of a cumulative counter when ``cumulative`` is set.
    """

    cumulative = False

    def __init__(self, *, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self._times: list[float] = []
        self._values: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def read(self) -> float:
        raise NotImplementedError

    def _poll(self) -> None:
        try:
            while not self._stop.is_set():
                value = self.read()
                self._times.append(time.time())
                self._values.append(value)
                self._stop.wait(self.interval_s)
        except BaseException as exc:  # noqa: BLE001 - re-raised in stop() on the caller's thread
            self._error = exc

    def start(self) -> None:
        self.read()  # fail now, on the caller's thread, if the source is unreadable
        self._times, self._values = [], []
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name=f"hmt-power-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> PowerTrace:
        if self._thread is None:
            raise RuntimeError(f"{self.name}: stop() before start()")
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise DeviceError(f"{self.name}: reading failed during the run ({self._error})") from self._error
        if self.cumulative:
            return trace_from_cumulative(self._times, self._values, self.name)
        return PowerTrace(np.asarray(self._times), np.asarray(self._values), self.name)
