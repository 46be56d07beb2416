"""A recorded power trace (CSV), parsed and aligned with the run's host timestamps.

Accepted columns (header names matched case-insensitively; units from the brackets):

- Monsoon PowerTool / PyMonsoon export: ``Time(ms), Main(mA), Main Voltage(V)`` or
  ``Time (s), Main Avg Current (mA), Main Avg Voltage (V)``;
- any logger: ``time, power`` (``Power (W)`` / ``(mW)``), or ``time, current, voltage``.

Times are seconds unless the header says ``ms``/``us``. Times above 1e9 are taken as Unix
epoch seconds and used as they are. Relative times are placed on the host clock either by
an explicit ``start_epoch_s`` or, failing that, by cross-correlating the trace with the
run's sync pattern (the busy/idle windows the calibration starts with).

The source reads the file when the run stops, so a trace being written live during the
run (a logger appending to it) works; a trace that does not cover the run is an error.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hmt.errors import InputError, UsageError
from hmt.profile.power.base import PowerSource, PowerTrace, Window

_UNIT = re.compile(r"[\(\[]\s*([a-zA-Zµ]+)\s*[\)\]]")
_TIME_SCALE = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_CURRENT_SCALE = {"a": 1.0, "ma": 1e-3, "ua": 1e-6}
_POWER_SCALE = {"w": 1.0, "mw": 1e-3, "uw": 1e-6}
EPOCH_THRESHOLD_S = 1e9


def _unit(header: str) -> str | None:
    match = _UNIT.search(header)
    return match.group(1).lower() if match else None


def _classify(header: str) -> str | None:
    h = header.strip().lower()
    if h.startswith("time") or h in ("t", "timestamp"):
        return "time"
    if "power" in h:
        return "power"
    if "volt" in h:
        return "voltage" if "usb" not in h and "aux" not in h else None
    if "current" in h or re.match(r"main\s*[\(\[]", h) or h in ("i", "current"):
        return "current" if "usb" not in h and "aux" not in h else None
    return None


def parse_power_csv(text: str, *, source: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """(times in s, power in W, times_are_epoch) from CSV text; refuses malformed input by line."""
    try:
        return _parse_power_csv(text, source=source)
    except csv.Error as exc:  # a field over csv's limit, a NUL byte: not a trace (was exit 70, after the whole run)
        raise InputError(f"{source}: not a readable CSV power trace ({exc})") from exc


def _parse_power_csv(text: str, *, source: str) -> tuple[np.ndarray, np.ndarray, bool]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise InputError(f"{source}: empty file; expected a CSV power trace with a header row") from None
    columns: dict[str, int] = {}
    for index, name in enumerate(header):
        kind = _classify(name)
        if kind and kind not in columns:
            columns[kind] = index
    if "time" not in columns:
        raise InputError(f"{source}: no time column in header {header}; expected e.g. 'Time (s)' or 'Time(ms)'")
    if "power" not in columns and not {"current", "voltage"} <= columns.keys():
        raise InputError(
            f"{source}: header {header} needs a power column, or current and voltage columns "
            "(e.g. 'Main(mA)' and 'Main Voltage(V)')"
        )
    time_scale = _TIME_SCALE.get(_unit(header[columns["time"]]) or "s")
    if time_scale is None:
        raise InputError(f"{source}: unknown time unit in {header[columns['time']]!r}; use s, ms or us")
    needed = [columns["time"]] + ([columns["power"]] if "power" in columns else
                                  [columns["current"], columns["voltage"]])
    rows = []
    for line_no, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        try:
            rows.append([float(row[i]) for i in needed])
        except (ValueError, IndexError):
            raise InputError(f"{source}: line {line_no}: expected numbers in columns "
                             f"{[header[i] for i in needed]}, got {row}") from None
    if len(rows) < 2:
        raise InputError(f"{source}: {len(rows)} data rows; a power trace needs at least 2")
    data = np.asarray(rows, float)
    if not np.isfinite(data).all():
        bad = int(np.argmax(~np.isfinite(data).all(axis=1))) + 1
        raise InputError(f"{source}: data row {bad}: NaN or infinity; a power trace holds finite numbers")
    times = data[:, 0] * time_scale
    if "power" in columns:
        scale = _POWER_SCALE.get(_unit(header[columns["power"]]) or "w")
        if scale is None:
            raise InputError(f"{source}: unknown power unit in {header[columns['power']]!r}; use W or mW")
        power = data[:, 1] * scale
    else:
        scale = _CURRENT_SCALE.get(_unit(header[columns["current"]]) or "ma")
        if scale is None:
            raise InputError(f"{source}: unknown current unit in {header[columns['current']]!r}; use A or mA")
        power = data[:, 1] * scale * data[:, 2]
    if np.any(np.diff(times) <= 0):
        bad = int(np.argmax(np.diff(times) <= 0)) + 3
        raise InputError(f"{source}: times do not increase at data line {bad}")
    return times, power, bool(times[0] > EPOCH_THRESHOLD_S)


def _best_lag(signal: np.ndarray, kernel: np.ndarray) -> tuple[int, float]:
    """Lag of the highest normalised (Pearson) correlation of ``kernel`` along ``signal``."""
    n = kernel.size
    numerator = np.correlate(signal, kernel, mode="valid")
    csum = np.concatenate(([0.0], np.cumsum(signal)))
    csum2 = np.concatenate(([0.0], np.cumsum(signal * signal)))
    s1 = csum[n:] - csum[:-n]
    s2 = csum2[n:] - csum2[:-n]
    variance = np.maximum(s2 - s1 * s1 / n, 1e-12)
    scores = numerator / np.sqrt(variance * float(np.sum(kernel * kernel)))
    lag = int(np.argmax(scores))
    return lag, float(scores[lag])


def align_to_pattern(times_rel: np.ndarray, power_w: np.ndarray, busy: Sequence[tuple[float, float]],
                     *, pattern_start: float | None = None, resolution_s: float = 0.01,
                     fine_s: float = 0.0005) -> float:
    """Offset (host = trace + offset) that best lines the trace up with known busy windows.

    ``busy`` holds host-time (start, end) pairs of windows where the device worked hard;
    between them it idled (and from ``pattern_start``, the start of the idle window before
    them, when given). The trace is resampled on a grid and cross-correlated with the
    0/1 busy indicator, normalised per lag so the pattern's shape must match rather than
    merely land on the most power-hungry stretch; a second pass at ``fine_s`` around the
    coarse peak refines the offset.
    """
    if not busy:
        raise InputError("no sync windows to align the trace with")
    first_busy = min(s for s, _ in busy)
    pattern_start = first_busy if pattern_start is None else min(pattern_start, first_busy)
    pattern_end = max(e for _, e in busy)
    if times_rel[-1] - times_rel[0] < pattern_end - pattern_start:
        raise InputError(
            f"the trace lasts {times_rel[-1] - times_rel[0]:.2f} s, shorter than the sync pattern "
            f"({pattern_end - pattern_start:.2f} s); it cannot cover the run"
        )

    def indicator(step: float) -> np.ndarray:
        grid = np.arange(pattern_start, pattern_end, step)
        out = np.zeros_like(grid)
        for s, e in busy:
            out[(grid >= s) & (grid < e)] = 1.0
        return out - out.mean()

    grid = np.arange(times_rel[0], times_rel[-1], resolution_s)
    lag, _ = _best_lag(np.interp(grid, times_rel, power_w), indicator(resolution_s))
    coarse = float(grid[lag])
    fine_kernel = indicator(fine_s)
    fine_grid = np.arange(max(times_rel[0], coarse - 2 * resolution_s),
                          min(times_rel[-1], coarse + 2 * resolution_s + (pattern_end - pattern_start)), fine_s)
    if fine_grid.size > fine_kernel.size:
        fine_lag, _ = _best_lag(np.interp(fine_grid, times_rel, power_w), fine_kernel)
        coarse = float(fine_grid[fine_lag])
    return float(pattern_start - coarse)


class TraceSource(PowerSource):
    """Reads a CSV trace when the run stops and puts it on the host clock."""

    name = "trace"

    def __init__(self, *, path: str | Path, start_epoch_s: float | None = None) -> None:
        self.path = Path(path)
        self.start_epoch_s = start_epoch_s
        self._windows: list[Window] = []
        if not self.path.is_file():
            raise InputError(f"{self.path}: does not exist; expected a power trace (CSV)")
        if start_epoch_s is not None and not math.isfinite(start_epoch_s):
            raise UsageError(f"--trace-start {start_epoch_s}: expected the trace's start as Unix time (seconds)")

    def start(self) -> None:
        self._windows = []

    def note_window(self, window: Window) -> None:
        self._windows.append(window)

    def stop(self) -> PowerTrace:
        idle = [w.t_start for w in self._windows if w.label == "idle"]
        return load_trace(self.path, start_epoch_s=self.start_epoch_s,
                          sync=[(w.t_start, w.t_end) for w in self._windows if w.label.startswith("sync-busy")],
                          sync_start=idle[0] if idle else None)


def load_trace(path: Path, *, start_epoch_s: float | None = None,
               sync: Sequence[tuple[float, float]] = (), sync_start: float | None = None) -> PowerTrace:
    """Parse and align a trace file (epoch times, an explicit start, or the sync pattern)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the power trace ({exc})") from exc
    times, power, is_epoch = parse_power_csv(text, source=str(path))
    trace = PowerTrace(times, power, f"trace:{path.name}")
    if is_epoch:
        return trace
    if start_epoch_s is not None:
        return trace.shifted(start_epoch_s - float(times[0]))
    if sync:
        offset = align_to_pattern(times, power, sync, pattern_start=sync_start)
        return PowerTrace(times + offset, power, trace.source, ("aligned by cross-correlation with the sync pattern",))
    raise InputError(
        f"{path}: times are relative (first {times[0]:.3f} s) and there is no start time or sync pattern "
        "to place them on the host clock; pass the trace's start as Unix time"
    )
