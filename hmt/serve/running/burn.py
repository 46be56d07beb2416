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
from bisect import bisect_right
from collections.abc import Sequence
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


class SharedPlan:
    """A step function of time that child processes read on their own: from ``start_s + times_s[i]``
    (the monotonic clock, which every process of a Linux machine shares) the value is ``values[i]``.

    A replay's load must change at the scenario's times whatever the replaying process is doing: set
    by the driver thread of serve's process, the load of a row at 6 s once stopped at 21 s instead of
    9 s (in a device class at a quarter core, the driver thread waited seconds for the interpreter
    while the burner, at full duty, took most of the class from serve). A child that reads its plan
    needs nothing of the parent after :meth:`set`. Made before the children are spawned (its arrays
    travel with them); ``capacity`` rows at most."""

    def __init__(self, ctx: Any, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        self._start = ctx.Value("d", -1.0, lock=False)  # < 0: no plan; the parent's set values hold
        self._count = ctx.Value("i", 0, lock=False)
        self._times = ctx.Array("d", self.capacity, lock=False)
        self._values = ctx.Array("d", self.capacity, lock=False)

    def set(self, start_s: float, times_s: Sequence[float], values: Sequence[float | None]) -> None:
        """Follow ``values`` (None: 0) from ``start_s + times_s`` on; times ascending. UsageError over capacity."""
        if len(times_s) != len(values):
            raise UsageError(f"plan: {len(times_s)} times for {len(values)} values")
        if len(times_s) > self.capacity:
            raise UsageError(f"plan: {len(times_s)} rows, room for {self.capacity}")
        if any(b < a for a, b in zip(times_s, times_s[1:])):
            raise UsageError("plan: times must be ascending")
        self._start.value = -1.0  # children ignore the plan while it is rewritten
        for i, (t, v) in enumerate(zip(times_s, values)):
            self._times[i] = float(t)
            self._values[i] = 0.0 if v is None else float(v)
        self._count.value = len(times_s)
        self._start.value = float(start_s)

    def at(self, now_s: float) -> float | None:
        """The value in force at ``now_s``: 0 before the plan's start, the first row's from the start on
        even when its time is later (as :meth:`Scenario.at` gives the loop); None without a plan."""
        start = float(self._start.value)
        if start < 0:
            return None
        count = int(self._count.value)
        if now_s < start or count == 0:
            return 0.0
        # on the shared array itself: a copy of the plan every 20 ms cost each burner its rows
        i = bisect_right(self._times, now_s - start, 0, count) - 1
        return float(self._values[max(0, i)])


def _burn(duty: Any, stop: Any, ready: Any, plan: SharedPlan | None = None, index: int = 0,
          cores: float = 1.0) -> None:  # pragma: no cover - runs in a child process
    x = 0.0
    parent = os.getppid()
    ready.set()  # the interpreter is up and the imports are done: what is left is the duty asked for
    # An orphan (the parent was killed before it could set ``stop``) must not burn forever.
    while not stop.is_set() and os.getppid() == parent:
        planned = None if plan is None else plan.at(time.monotonic())
        share = float(duty.value) if planned is None else _duty(planned, cores, index)
        start = time.perf_counter()
        busy_until = start + share * _BURN_SLOT_S
        while time.perf_counter() < busy_until:
            x = x * 1.0000001 + 1.0
        rest = _BURN_SLOT_S - (time.perf_counter() - start)
        if rest > 0:
            time.sleep(rest)


def _duty(cpu_load: float | None, cores: float, index: int) -> float:
    """Burner ``index``'s busy share for ``cpu_load`` of ``cores``: the first ones flat out, the next part."""
    total = 0.0 if cpu_load is None else min(1.0, max(0.0, cpu_load)) * cores
    return min(1.0, max(0.0, total - index))


class LoadGenerator:
    """Busy processes that together keep ``cpu_load`` of ``cores`` busy: ``ceil(cores)`` of them, the
    first ones flat out, the next part of the time. ``cores`` (cores' worth of CPU time per second)
    defaults to this process's capacity (:func:`hmt.runtime.cpus.cpu_capacity`)."""

    def __init__(self, cores: float | None = None, plan_rows: int = 0) -> None:
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
        # ``plan_rows`` > 0: room for a plan the burners follow on their own (:meth:`follow`)
        self._plan = SharedPlan(ctx, plan_rows) if plan_rows > 0 else None
        self._procs = [ctx.Process(target=_burn, args=(d, self._stop, r, self._plan, i, self.cores), daemon=True,
                                   name=f"hmt-burn-{i}")
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
        """Busy share of the capacity: the first processes run flat out, the next one part of the time.
        A plan being followed (:meth:`follow`) takes precedence in the burners."""
        self.load = 0.0 if cpu_load is None else min(1.0, max(0.0, cpu_load))
        for i, duty in enumerate(self._duties):
            duty.value = _duty(cpu_load, self.cores, i)

    def follow(self, start_s: float, times_s: Sequence[float], cpu_loads: Sequence[float | None]) -> None:
        """From now on the burners change their duty at ``start_s + times_s`` (monotonic clock) by
        themselves, whatever this process is doing (:class:`SharedPlan`). Needs ``plan_rows``."""
        if self._plan is None:
            raise UsageError("load generator: made without room for a plan (plan_rows=0)")
        self._plan.set(start_s, times_s, cpu_loads)

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
