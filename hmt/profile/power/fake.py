"""A simulated power meter with known coefficients, for tests and demos.

During each window it is told about (``note_window``), it draws idle power plus the
energy that eq. 1 with ``coefficients`` gives for the workload's feature row, spread
evenly over the window; elsewhere it draws idle power. Calibrating against it must
recover ``coefficients``: that is the end-to-end test of the calibration path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from hmt.profile.power.base import PowerSource, PowerTrace, Window


class FakePowerSource(PowerSource):
    name = "fake"

    def __init__(self, *, coefficients_mj: Sequence[float] = (2e-9, 1.2e-8, 4e-7), idle_w: float = 3.0,
                 noise_w: float = 0.0, sample_hz: float = 2000.0, seed: int = 0) -> None:
        self.coefficients_mj = tuple(float(c) for c in coefficients_mj)
        self.idle_w = idle_w
        self.noise_w = noise_w
        self.sample_hz = sample_hz
        self._rng = np.random.default_rng(seed)
        self._windows: list[Window] = []
        self._t0 = 0.0

    def start(self) -> None:
        self._windows = []
        self._t0 = time.time()

    def note_window(self, window: Window) -> None:
        self._windows.append(window)

    def true_energy_mj(self, design_row: Sequence[float]) -> float:
        return float(np.dot(design_row[: len(self.coefficients_mj)], self.coefficients_mj))

    def stop(self) -> PowerTrace:
        t1 = time.time()
        times = np.arange(self._t0, t1 + 1.0 / self.sample_hz, 1.0 / self.sample_hz)
        power = np.full(times.shape, self.idle_w)
        for window in self._windows:
            if not window.design_row or window.duration_s <= 0:
                continue
            extra_w = self.true_energy_mj(window.design_row) * 1e-3 * window.runs / window.duration_s
            power[(times >= window.t_start) & (times < window.t_end)] += extra_w
        if self.noise_w:
            power = power + self._rng.normal(0.0, self.noise_w, size=power.shape)
        return PowerTrace(times, power, self.name)
