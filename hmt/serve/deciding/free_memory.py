"""The memory budget cut to what the device has free: real memory pressure reaches the pool.

The configured memory budget (serve.json ``budgets.memory_mb``, ``--memory-mb``) is a fixed
ceiling. With serve.json ``memory_reserve_mb`` set, the loop also keeps that much of the device's
*available* memory (the monitor's reading, ``MemAvailable`` on Linux) free for everything else:
the loaded variants may grow only into what is available above the reserve,

    limit = loaded variants' footprints + (available - reserve),  at least 0,

and the budget the loop decides and trims with is the smaller of the two. When another process
takes memory, the available reading falls, the limit with it, and the loop moves to a variant that
fits and unloads the rest (a limit of 0: nothing fits, the loop serves the variant of least
memory). A cut applies at once; a rise once every reading of the last ``hold_s`` allows it. By
default there is no hold: the switcher already keeps a single reading above the reserve from
bringing a variant back (a climb needs the same proposal for ``improve_patience`` decisions and
the switcher's dwell, ``min_dwell_s``), so a hold only delays the way back once the memory is free.
Measured on the second bundle of the scenario matrix under TVM: with a 0.25 s hold the loop was
back on its home variant 0.7-0.8 s after another process released its memory (the monitor's
reading, the hold, then the patience, one periodic decision each), 5-8 points of accuracy under
the best static choice over the next 2.5 s; 0.5 s held it 0.25 s longer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from hmt.runtime.settings import Budgets
from hmt.serve.deciding.monitor import ResourceSample

HOLD_S = 0.0  # a rise of the free-memory limit waits until it held this long (none: see the module docstring)


class FreeMemory:
    """The free-memory limit of the loaded variants (MB), from the monitor's readings."""

    def __init__(self, reserve_mb: float | None, hold_s: float = HOLD_S) -> None:
        self.reserve_mb = reserve_mb
        self.hold_s = hold_s
        self._limits: deque[tuple[float, float]] = deque()  # (time, limit MB) within hold_s
        self.limit_mb: float | None = None  # the last limit (None: no reserve set)

    def update(self, now_s: float, sample: ResourceSample, loaded_bytes: int) -> float | None:
        """File one reading; the limit now (MB; None: no reserve, the configured budget alone)."""
        if self.reserve_mb is None:
            return None
        raw_mb = max(0.0, (loaded_bytes + sample.mem_available_bytes) / 1e6 - self.reserve_mb)
        limits = self._limits
        limits.append((now_s, raw_mb))
        while limits and limits[0][0] < now_s - self.hold_s:
            limits.popleft()
        self.limit_mb = min(m for _, m in limits)
        return self.limit_mb

    def cap(self, budgets: Budgets) -> Budgets:
        """``budgets`` with the memory budget at most the last limit."""
        limit = self.limit_mb
        if limit is None or (budgets.memory_mb is not None and budgets.memory_mb <= limit):
            return budgets
        return replace(budgets, memory_mb=limit)
