"""Energy calibration: run workloads under a power source, integrate, fit eq. 1.

The run is a timeline of windows on the host clock: first an idle window (baseline
power), then a sync pattern (busy/idle/busy... with a known rhythm, so a trace recorded
on another clock can be aligned by cross-correlation), then one window per workload in
which it runs back to back. Each workload's energy per inference is the window's energy
above the idle baseline divided by its runs (dynamic energy: what choosing a variant
changes). Workload windows are separated by short idle gaps, so a trace aligned a few
milliseconds off moves idle power across a window edge rather than a neighbour's. The
timeline is kept in the profile, so a trace recorded during the run can be matched later.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hmt.errors import InputError
from hmt.profile.fits import LinearFit, calibrate_energy
from hmt.profile.power.base import PowerSource, PowerTrace, Window
from hmt.progress import ProgressCallback, no_progress


@dataclass(frozen=True)
class Workload:
    label: str
    run: Callable[[], object]
    design_row: tuple[float, ...]


@dataclass(frozen=True)
class CalibrationResult:
    fit: LinearFit
    idle_w: float
    windows: tuple[Window, ...]
    energy_mj: tuple[float, ...]  # per inference, per workload window
    source: str
    trace_span_s: tuple[float, float]


def _run_for(workload: Workload, seconds: float) -> Window:
    runs = 0
    start = time.time()
    deadline = start + seconds
    while True:
        workload.run()
        runs += 1
        now = time.time()
        if now >= deadline:
            return Window(workload.label, start, now, runs, workload.design_row)


def record_timeline(source: PowerSource, workloads: Sequence[Workload], *, window_s: float = 1.0,
                    idle_s: float = 1.0, sync_cycles: int = 3, sync_s: float = 0.4,
                    progress: ProgressCallback = no_progress) -> tuple[list[Window], PowerTrace]:
    """Run the timeline under ``source`` and return its windows and the power trace."""
    if not workloads:
        raise ValueError("no workloads to calibrate with")
    gap_s = min(0.05, window_s / 4)
    windows: list[Window] = []
    source.start()
    try:
        # Live sources (NVML, RAPL) sample on a thread: let the first sample land before
        # the first window opens, or the trace starts a few ms after the run (seen on NVML).
        time.sleep(0.25)
        t0 = time.time()
        time.sleep(idle_s)
        windows.append(Window("idle", t0, time.time(), 0))
        busy = workloads[int(np.argmax([sum(w.design_row) for w in workloads]))]
        for cycle in range(sync_cycles):
            # Busy 1x, 2x, 1x ...: a rhythm the workload windows after it do not repeat.
            window = _run_for(busy, sync_s * (1 + cycle % 2))
            windows.append(Window(f"sync-busy-{cycle}", window.t_start, window.t_end, window.runs, busy.design_row))
            quiet = time.time()
            time.sleep(sync_s)
            windows.append(Window(f"sync-idle-{cycle}", quiet, time.time(), 0))
        for index, workload in enumerate(workloads):
            workload.run()  # warm-up outside the window
            time.sleep(gap_s)  # an idle gap: a misaligned trace then shifts idle power, not a neighbour's
            windows.append(_run_for(workload, window_s))
            progress("energy calibration", index + 1, len(workloads), workload.label)
        time.sleep(0.05)
        t_end = time.time()  # a closing idle window: the baseline must not have moved meanwhile
        time.sleep(idle_s)
        windows.append(Window("idle-end", t_end, time.time(), 0))
        time.sleep(0.05)  # the trace runs past the last window
    except BaseException:
        with contextlib.suppress(Exception):
            source.stop()
        raise
    for window in windows:
        source.note_window(window)
    trace = source.stop()
    return windows, trace


# Idle power before and after the workloads may differ this much (a GPU's clocks and temperature
# settle after a run); more means another consumer shared the meter and every figure is off.
IDLE_DRIFT_SHARE = 0.5
IDLE_DRIFT_W = 2.0


def energy_per_inference(trace: PowerTrace, windows: Sequence[Window]) -> tuple[float, list[float]]:
    """(idle watts, dynamic mJ per inference of each workload window)."""
    idle = [w for w in windows if w.label == "idle"]
    if not idle:
        raise InputError("the timeline has no idle window to take the baseline power from")
    idle_w = trace.mean_power_w(idle[0].t_start, idle[0].t_end)
    closing = [w for w in windows if w.label == "idle-end"]
    if closing:
        end_w = trace.mean_power_w(closing[0].t_start, closing[0].t_end)
        low, high = sorted((idle_w, end_w))
        if high - low > max(IDLE_DRIFT_W, IDLE_DRIFT_SHARE * max(low, 1e-9)):
            raise InputError(
                f"the meter's idle power moved from {idle_w:.1f} W before the workloads to {end_w:.1f} W after "
                "them: something else drew power during the run (another process on this GPU or CPU package?); "
                "rerun with the device otherwise idle")
    energies = []
    for window in windows:
        if not window.is_workload:
            continue
        total_j = trace.energy_j(window.t_start, window.t_end)
        energies.append((total_j - idle_w * window.duration_s) * 1e3 / window.runs)
    return idle_w, energies


def calibrate(source: PowerSource, workloads: Sequence[Workload], *, names: Sequence[str], window_s: float = 1.0,
              idle_s: float = 1.0, sync_s: float = 0.4, progress: ProgressCallback = no_progress) -> CalibrationResult:
    windows, trace = record_timeline(source, workloads, window_s=window_s, idle_s=idle_s, sync_s=sync_s,
                                     progress=progress)
    return calibrate_from_trace(trace, windows, names=names, source=source.describe())


def calibrate_from_trace(trace: PowerTrace, windows: Sequence[Window], *, names: Sequence[str],
                         source: str) -> CalibrationResult:
    """Fit eq. 1 from a trace and a timeline (also used for a trace recorded elsewhere)."""
    idle_w, energies = energy_per_inference(trace, windows)
    work = [w for w in windows if w.is_workload]
    design = np.asarray([w.design_row for w in work], float)
    positive = np.asarray(energies) > 0
    if positive.sum() < 1:
        raise InputError(
            f"{source}: no workload drew measurably more power than idle ({idle_w:.3f} W); the meter is too "
            "coarse for these workloads or measures another rail"
        )
    fit = calibrate_energy(design[positive], np.asarray(energies)[positive], names=names)
    return CalibrationResult(fit, idle_w, tuple(windows), tuple(float(e) for e in energies), source,
                             (trace.t_start, trace.t_end))


def held_out_energy(design: np.ndarray, energy_mj: Sequence[float] | np.ndarray, *, names: Sequence[str],
                    groups: Sequence[str]) -> np.ndarray:
    """Each row's eq. 1 prediction from a fit that never saw its group (leave one group out).

    ``groups`` names what a row belongs to (a variant measured several times is one group), so
    a prediction is always of a workload the fit did not see: the error it gives is the
    held-out error, not the in-sample one.
    """
    X = np.asarray(design, float)
    y = np.asarray(energy_mj, float)
    labels = np.asarray(list(groups))
    if X.shape[0] != y.shape[0] or labels.shape[0] != y.shape[0]:
        raise ValueError(f"design {X.shape}, {y.shape[0]} energies and {labels.shape[0]} groups do not match")
    if np.unique(labels).size < 2:
        raise InputError("held-out energy needs workloads of at least 2 groups")
    predicted = np.empty(y.shape[0])
    for group in np.unique(labels):
        test = labels == group
        fit = calibrate_energy(X[~test], y[~test], names=names, cross_validate=False)
        predicted[test] = fit.predict(X[test])
    return predicted
