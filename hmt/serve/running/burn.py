"""Real CPU load for scenario replay: busy processes sized to the CPU capacity serve has.

The scenario column ``cpu_load`` says what share of the CPU other work takes from that row on.
:class:`LoadGenerator` makes it real in ``burn`` mode: child processes (spawned: safe beside threads)
that spin for their share of every 20 ms slot and sleep the rest. Being serve's children, they are in
serve's cgroup: inside an emulated device class (``benchmarks/device/device_class.py``) they run on the
class's cores and are held to the class's budget with serve, as other work on the device would be.

The share is of the capacity :func:`hmt.runtime.cpus.cpu_capacity` finds: the cores this process may
run on (affinity, cpuset) and its cgroup's CPU quota. Without a limit that is one burner per core, each
busy ``cpu_load`` of the time. A class of one core gets one burner, busy half the time at ``cpu_load``
0.5: half of that core, not a core's worth per host CPU. A class paced from outside (the benchmarks'
pacer keeps its budget by stopping and continuing it, no kernel quota) is a uniformly slower core, so
a burner busy half of the wall time takes half of it. A kernel quota of a fraction of a core (0.25) is
CPU time, not speed: one burner busy ``cpu_load`` x 0.25 of each slot uses that share of the quota.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from typing import Any

from hmt.errors import DeviceError, UsageError
from hmt.runtime.cpus import CpuCapacity, cpu_capacity

_BURN_SLOT_S = 0.02
START_TIMEOUT_S = 30.0  # a child process that is not up by then: the machine is too busy to replay on


def wait_ready(events: list[Any], timeout_s: float, what: str) -> None:
    """Wait until every child of ``what`` has set its ready event; DeviceError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for event in events:
        if not event.wait(max(0.0, deadline - time.monotonic())):
            raise DeviceError(f"{what}: a child process was not up after {timeout_s:g} s")


def _burn(duty: Any, stop: Any, ready: Any) -> None:  # pragma: no cover - runs in a child process
    x = 0.0
    parent = os.getppid()
    ready.set()  # the interpreter is up and the imports are done: what is left is the duty asked for
    # An orphan (the parent was killed before it could set ``stop``) must not burn forever.
    while not stop.is_set() and os.getppid() == parent:
        share = float(duty.value)
        start = time.perf_counter()
        busy_until = start + share * _BURN_SLOT_S
        while time.perf_counter() < busy_until:
            x = x * 1.0000001 + 1.0
        rest = _BURN_SLOT_S - (time.perf_counter() - start)
        if rest > 0:
            time.sleep(rest)


class LoadGenerator:
    """Busy processes that together keep ``cpu_load`` of ``cores`` busy: ``ceil(cores)`` of them, the
    first ones flat out, the next part of the time. ``cores`` (cores' worth of CPU time per second)
    defaults to this process's capacity (:func:`hmt.runtime.cpus.cpu_capacity`)."""

    def __init__(self, cores: float | None = None) -> None:
        self.capacity: CpuCapacity | None = None
        if cores is None:
            self.capacity = cpu_capacity()
            cores = self.capacity.cores
        if not (math.isfinite(cores) and cores > 0):
            raise UsageError(f"load generator: CPU capacity must be > 0 cores, got {cores}")
        self.cores = float(cores)
        self.processes = max(1, math.ceil(self.cores - 1e-9))
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._duties = [ctx.Value("d", 0.0, lock=False) for _ in range(self.processes)]
        self._ready = [ctx.Event() for _ in self._duties]
        self._procs = [ctx.Process(target=_burn, args=(d, self._stop, r), daemon=True, name=f"hmt-burn-{i}")
                       for i, (d, r) in enumerate(zip(self._duties, self._ready))]
        self.load = 0.0

    @property
    def duties(self) -> list[float]:
        """Each burner's busy share of its slots (wall time), as last set."""
        return [float(d.value) for d in self._duties]

    def describe(self) -> dict[str, Any]:
        """What the busy phases were sized to (for a run's summary)."""
        doc: dict[str, Any] = {"cores": round(self.cores, 4), "processes": self.processes}
        if self.capacity is not None:
            doc["capacity"] = self.capacity.describe()
            if self.capacity.notes:
                doc["capacity_notes"] = list(self.capacity.notes)
        return doc

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the burners and return once each is up (spawning one is a new interpreter and its
        imports: about a core-second that would otherwise land in the replay's first second as load
        the scenario did not ask for, and send the loop to its smallest variant at t = 0)."""
        for proc in self._procs:
            proc.start()
        wait_ready(self._ready, timeout_s, "load generator")

    def set(self, cpu_load: float | None) -> None:
        """Busy share of the capacity: the first processes run flat out, the next one part of the time."""
        total = 0.0 if cpu_load is None else min(1.0, max(0.0, cpu_load)) * self.cores
        self.load = total / self.cores
        for i, duty in enumerate(self._duties):
            duty.value = min(1.0, max(0.0, total - i))

    def stop(self) -> None:
        """Stop the burners; safe after a start that failed part-way (a burner never started is skipped)."""
        self._stop.set()
        for proc in self._procs:
            if proc.pid is None:  # never started (start raised before it): nothing to join
                continue
            proc.join(2.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
