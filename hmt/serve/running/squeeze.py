"""Real memory pressure for scenario replay: another process that takes and touches memory.

The scenario column ``memory_squeeze_mb`` says how much memory another process holds from that
row on. :class:`MemorySqueeze` makes it real: one child process (spawned: safe beside threads)
allocates that many MB and makes every page of it resident, so the machine's available memory (what the
serve monitor reads) falls by that much, and frees it when the next row asks for less. The
child keeps at most :data:`MAX_SQUEEZE_MB` and never more than the available memory less
:data:`KEEP_FREE_MB`, so a scenario cannot push the machine into swapping or the OOM killer.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

import psutil

from hmt.errors import UsageError
from hmt.serve.running.burn import START_TIMEOUT_S, SharedPlan, wait_ready

MAX_SQUEEZE_MB = 8192.0
KEEP_FREE_MB = 1024.0  # the squeeze never takes the machine's available memory below this
_PAGE = 4096
_CHUNK_MB = 64


def _chunk() -> Any:
    """64 MB, resident: mapped with MAP_POPULATE (the kernel faults every page in, one call), else
    a buffer whose every page is written."""
    size = _CHUNK_MB * 1_000_000
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate and hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    chunk = bytearray(size)
    for i in range(0, size, _PAGE):
        chunk[i] = 1
    return chunk


def _hold(wanted: Any, held: Any, stop: Any, ready: Any,
          plan: SharedPlan | None = None) -> None:  # pragma: no cover - runs in a child process
    chunks: list[Any] = []
    parent = os.getppid()
    ready.set()
    # An orphan (the parent was killed before it could set ``stop``) must not hold memory forever.
    while not stop.is_set() and os.getppid() == parent:
        planned = None if plan is None else plan.at(time.monotonic())
        mb = float(wanted.value) if planned is None else min(MAX_SQUEEZE_MB, max(0.0, planned))
        target = int(mb // _CHUNK_MB)
        while len(chunks) > target:
            chunk = chunks.pop()
            if isinstance(chunk, mmap.mmap):
                chunk.close()
        while len(chunks) < target:
            if psutil.virtual_memory().available / 1e6 < KEEP_FREE_MB + _CHUNK_MB:
                break
            chunks.append(_chunk())
        held.value = float(len(chunks) * _CHUNK_MB)
        stop.wait(0.02)


class MemorySqueeze:
    """One child process holding ``set(mb)`` MB of touched memory (in steps of 64 MB)."""

    def __init__(self, plan_rows: int = 0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._wanted = ctx.Value("d", 0.0, lock=False)
        self._held = ctx.Value("d", 0.0, lock=False)
        self._ready = ctx.Event()
        # ``plan_rows`` > 0: room for a plan the child follows on its own (:meth:`follow`)
        self._plan = SharedPlan(ctx, plan_rows) if plan_rows > 0 else None
        self._proc = ctx.Process(target=_hold, args=(self._wanted, self._held, self._stop, self._ready, self._plan),
                                 daemon=True, name="hmt-memory-squeeze")

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the child and return once it is up (see :meth:`LoadGenerator.start`)."""
        self._proc.start()
        wait_ready([self._ready], timeout_s, "memory squeeze")

    def set(self, mb: float | None) -> None:
        """Hold ``mb`` MB from now on (None or 0: none)."""
        self._wanted.value = 0.0 if mb is None else min(MAX_SQUEEZE_MB, max(0.0, float(mb)))

    def follow(self, start_s: float, times_s: Sequence[float], squeeze_mb: Sequence[float | None]) -> None:
        """From now on the child holds ``squeeze_mb`` from ``start_s + times_s`` (monotonic clock) by
        itself, whatever this process is doing (:class:`hmt.serve.running.burn.SharedPlan`)."""
        if self._plan is None:
            raise UsageError("memory squeeze: made without room for a plan (plan_rows=0)")
        self._plan.set(start_s, times_s, squeeze_mb)

    @property
    def held_mb(self) -> float:
        """What the child holds now (it takes a moment to allocate a step)."""
        return float(self._held.value)

    def stop(self) -> None:
        """Stop the holder; safe when its start failed (a process never started is not joined)."""
        self._stop.set()
        if self._proc.pid is None:
            return
        self._proc.join(5.0)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(2.0)
