"""A device class's CPU budget, enforced every millisecond: its busy processes stopped and continued.

    python -m benchmarks.device.pacer PROCS_FILE CPU_BUDGET CORES CYCLE_US [per-core]

Why not the kernel's CFS quota alone: the quota is enforced at the scheduler tick (4 ms at this
kernel's HZ=250), whatever the period. A class at 25 % runs a whole tick at full speed, owes three
and is throttled for about 12 ms (``class_throttle`` measures it): a ~1 ms inference is either
unthrottled or stalled for a tick's debt, a bimodal latency that no slow board has.

The pacer keeps the budget over short cycles instead (``CYCLE_US``, default 1 ms): at each cycle
start it reads the CPU time every process in the class has used (perf task-clock counters of its
threads, exact when read, see :class:`ProcessCpu`), continues the class if its budget for this cycle is not spent
(the budget, less any overshoot carried as debt; unused budget is not saved up, as with a CFS quota
without burst), sleeps (SCHED_FIFO, hrtimer) until the class could have spent it, and stops the
processes that used CPU meanwhile (``StopBusy``: SIGSTOP, then SIGCONT) once it has, until the next
cycle. A class that is idle is never stopped, so a request that arrives wakes it at once. Over a busy
stretch the class gets ``CPU_BUDGET`` CPU-seconds per second in pieces of at most a cycle, which for
work longer than a few cycles is a uniformly slower CPU. With ``per-core`` the budget is kept per core
as well: a process uses at most ``CPU_BUDGET / CORES`` of a CPU for each of its threads that ran in the
cycle (their own counters), so one thread runs as fast as on one of the board's cores, not on the class's
pooled budget (see :func:`pace`).

On exit (SIGTERM) it continues every process of the class and prints what it delivered (JSON).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CYCLE_US = 1_000
MIN_SLEEP_S = 20e-6
MAX_DEBT_CYCLES = 50


def process_cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (Linux: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED))."""
    return ((~pid) << 3) | 2


_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}  # the syscall's number per machine
_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_TASK_CLOCK, _PERF_ATTR_SIZE = 1, 1, 128


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def open_task_clock(tid: int) -> int:
    """A perf ``task-clock`` counter of thread ``tid`` (an fd; reading it gives its CPU ns since the open).

    Reading it brings the count up to date on whatever core the thread runs (the kernel asks that core),
    unlike a process CPU clock read from another process (see :class:`ProcessCpu`)."""
    import ctypes

    number = _PERF_EVENT_OPEN.get(os.uname().machine)
    if number is None:
        raise OSError(f"perf_event_open: no syscall number known for {os.uname().machine}")
    attr = bytearray(_PERF_ATTR_SIZE)
    struct.pack_into("IIQ", attr, 0, _PERF_TYPE_SOFTWARE, _PERF_ATTR_SIZE, _PERF_COUNT_SW_TASK_CLOCK)
    fd = int(_libc().syscall(number, ctypes.create_string_buffer(bytes(attr), _PERF_ATTR_SIZE), tid, -1, -1, 0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open(task-clock, {tid}): {os.strerror(err)}")
    return fd


def read_task_clock(fd: int) -> float:
    """CPU seconds counted by an :func:`open_task_clock` counter."""
    return int(struct.unpack("Q", os.read(fd, 8))[0]) / 1e9


def _read_process_clock(pid: int) -> float:
    return time.clock_gettime(process_cpu_clock(pid))


def _list_threads(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


@dataclass
class ProcessCpu:
    """CPU seconds a process has used, exact when read, even while it runs on another core.

    A process's own CPU clock (``process_cpu_clock``) is not: read from another process, Linux brings
    it up to date only at the process's scheduler ticks and switches (``thread_group_cputime`` adds the
    pending runtime for the caller's own process only; a thread clock of another process is refused).
    A class process running on another core than the pacer's then shows no CPU time for a tick (4 ms)
    and all of it at once; the pacer stops it a tick late, and the class runs ~1 ms calls at full speed,
    then owes for ~16 ms. Measured on the 2-core development VM: read from the other core, a busy
    process's clock was unchanged in 1,911 of 2,000 reads 100 us apart, and the rpi4 class held or not
    by which core the pacer ran on. A perf ``task-clock`` counter per thread is exact when read: the
    process's time is what its threads' counters counted (a thread found at a later listing is counted
    from then on) plus the most its own clock has ever been ahead of them (what a thread used before
    its counter opened, or after the last listing before it exited), so that every change is seen when
    it happens and the total still catches up with the process clock at the next tick. Without perf
    (``counters=False``, or perf_event_open refused) the process clock alone, and :attr:`exact` says so."""

    counters: bool = True
    open_counter: Callable[[int], int] = open_task_clock
    read_counter: Callable[[int], float] = read_task_clock
    read_process: Callable[[int], float] = _read_process_clock
    threads: Callable[[int], list[int]] = _list_threads
    relist_s: float = 0.01  # a process's threads are re-listed this often
    clock: Callable[[], float] = time.monotonic
    refused: str | None = None  # why perf counters could not be opened
    _offset: dict[int, float] = field(default_factory=dict)  # pid: CPU time its counters did not count
    _fds: dict[int, dict[int, int]] = field(default_factory=dict)  # pid: {tid: counter fd}
    _listed_at: dict[int, float] = field(default_factory=dict)
    _value: dict[int, float] = field(default_factory=dict)
    _threads: dict[int, dict[int, float]] = field(default_factory=dict)  # pid: {tid: CPU s its counter counted}

    @property
    def exact(self) -> bool:
        return self.counters and self.refused is None

    def _relist(self, pid: int) -> dict[int, int]:
        fds = self._fds.setdefault(pid, {})
        now = self.clock()
        if now - self._listed_at.get(pid, float("-inf")) < self.relist_s:
            return fds
        self._listed_at[pid] = now
        with contextlib.suppress(OSError, ValueError):  # exited: its counters keep what they counted
            for tid in self.threads(pid):
                if tid not in fds:
                    try:
                        fds[tid] = self.open_counter(tid)
                    except OSError as exc:
                        if tid == pid:  # not a thread that just exited: perf is refused here
                            self.refused = str(exc)
        return fds

    def __call__(self, pid: int) -> float:
        """CPU seconds of ``pid`` since it started (OSError when it has exited and was never read)."""
        try:
            whole = self.read_process(pid)
        except OSError:
            if pid not in self._value:
                raise
            whole = 0.0
        if not self.exact:
            value = max(self._value.get(pid, 0.0), whole)
        else:
            per_thread = {tid: self.read_counter(fd) for tid, fd in self._relist(pid).items()}
            self._threads[pid] = per_thread
            counted = sum(per_thread.values())
            # What the counters never saw (before they opened, threads gone before a listing) is the most
            # the process clock has ever been ahead of them: a lower bound that the next tick brings up to
            # date. Taking the process clock itself whenever it is ahead would make every reading as stale.
            offset = max(self._offset.get(pid, 0.0), whole - counted)
            self._offset[pid] = offset
            value = max(self._value.get(pid, 0.0), counted + offset)
        self._value[pid] = value
        return value

    def thread_seconds(self, pids: list[int]) -> dict[tuple[int, int], float]:
        """CPU seconds each thread of ``pids`` has used since its counter opened, as of the last reading
        (empty without perf counters: only the process clock is known then)."""
        if not self.exact:
            return {}
        return {(pid, tid): v for pid in pids for tid, v in self._threads.get(pid, {}).items()}

    def forget(self, keep: set[int]) -> None:
        """Close the counters of processes not in ``keep`` (they left the class)."""
        for pid in [p for p in self._fds if p not in keep]:
            self._threads.pop(pid, None)
            for fd in self._fds.pop(pid).values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._listed_at.pop(pid, None)


@dataclass
class ClassCpu:
    """CPU seconds used by the processes of a cgroup since the first reading (exited ones keep theirs)."""

    procs: Path
    read_clock: Callable[[int], float] = field(default_factory=ProcessCpu)
    relist_s: float = 0.01  # the process list is re-read this often (a new process's earlier CPU time still counts)
    clock: Callable[[], float] = time.monotonic
    seen: dict[int, float] = field(default_factory=dict)
    total_s: float = 0.0
    started: bool = False
    _listed: list[int] = field(default_factory=list)
    _listed_at: float = float("-inf")

    def pids(self) -> list[int]:
        now = self.clock()
        if now - self._listed_at >= self.relist_s:
            try:
                self._listed = [int(p) for p in self.procs.read_text().split()]
            except (OSError, ValueError):
                self._listed = []
            self._listed_at = now
            if isinstance(self.read_clock, ProcessCpu):
                self.read_clock.forget(set(self._listed))
        return self._listed

    def __call__(self) -> float:
        for pid in self.pids():
            try:
                now = self.read_clock(pid)
            except OSError:
                continue  # exited between the listing and the read
            # A process seen for the first time: its CPU time so far counts, except at the first reading.
            before = self.seen.get(pid, now if not self.started else 0.0)
            self.total_s += max(0.0, now - before)
            self.seen[pid] = now
        self.started = True
        return self.total_s

    def threads(self) -> dict[tuple[int, int], float]:
        """Each class thread's CPU seconds as of the last call (empty where threads cannot be read)."""
        clocks = self.read_clock
        return clocks.thread_seconds(self._listed) if isinstance(clocks, ProcessCpu) else {}


@dataclass
class Budget:
    """Token bucket of one cycle: ``allowance`` per cycle, overshoot carried as debt, no saving up."""

    per_cycle_s: float
    debt_s: float = 0.0

    def allowed(self) -> float:
        """CPU seconds the class may use in the cycle that starts now."""
        return self.per_cycle_s - self.debt_s

    def settle(self, used_s: float) -> None:
        """The cycle is over and the class used ``used_s``: what it overshot is owed (at most ``MAX_DEBT_CYCLES``
        cycles' budget, so nothing the pacer failed to stop can keep the class stopped for long), unused is lost."""
        self.debt_s = min(MAX_DEBT_CYCLES * self.per_cycle_s, max(0.0, self.debt_s + used_s - self.per_cycle_s))


def _used(before: dict[Any, float], now: dict[Any, float]) -> dict[Any, float]:
    """CPU seconds each thread used between two readings (a thread first seen counts from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in now.items()}


def _cores_left(used: dict[tuple[int, int], float], cap: float, cores: int) -> dict[int, float]:
    """Per process: CPU seconds it may still use this cycle, at ``cap`` a core for each thread of it that
    ran this cycle (at most ``cores``). A process is stopped as a whole (SIGSTOP), so its threads share
    their cores' shares: a thread alone gets one core's share; two threads of unequal work get two
    shares between them, not a stop as soon as the busier one reaches its own (it would stop the other)."""
    total: dict[int, float] = {}
    ran: dict[int, int] = {}
    for (pid, _tid), seconds in used.items():
        total[pid] = total.get(pid, 0.0) + seconds
        ran[pid] = ran.get(pid, 0) + (seconds > 0.05 * cap)
    return {pid: cap * min(cores, max(1, ran[pid])) - total[pid] for pid in total}


def pace(freeze: Callable[..., None], cpu: Callable[[], float], *, cpu_budget: float, cores: int,
         cycle_s: float, stop: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep,
         threads: Callable[[], dict[tuple[int, int], float]] | None = None) -> dict[str, float]:
    """Run cycles until ``stop()``; returns how many cycles ran, how many froze the class, over how long.

    With ``threads`` (each (pid, tid)'s CPU seconds, read after ``cpu()``) the budget is also kept per
    core: no thread gets much more than ``cpu_budget / cores`` of a CPU, as no thread of a board whose
    cores each run at that speed would. Without it the class's budget is a pool: one busy thread alone on a
    two-core class at 40 % each ran at 80 % of a core, twice a board core's speed. A process that used
    a core's share for each of its threads that ran (``_cores_left``) is stopped alone (``freeze(True,
    pids)``) while the others run on to the class's budget (``cycles_hot``: cycles in which one was)."""
    budget = Budget(cpu_budget * cycle_s)
    per_thread = Budget(cpu_budget / cores * cycle_s)
    read_threads = threads or dict
    began = start = clock()
    used_at, threads_at = cpu(), read_threads()
    frozen = False
    cycles = total_cycles = frozen_cycles = hot_cycles = 0
    while not stop():
        cycle_start = start + cycles * cycle_s
        now = clock()
        if now > cycle_start + cycle_s:  # the pacer itself was late: restart the schedule from now
            start, cycles, cycle_start = now, 0, now
        cycles += 1
        total_cycles += 1
        cycle_end = cycle_start + cycle_s
        allowed, cap = budget.allowed(), per_thread.allowed()
        if allowed > 0 and cap > 0:
            if frozen:
                freeze(False)
                frozen = False
            capped: set[int] = set()
            # The soonest the class (or one thread) could have spent it. (Sleeping for as long as it lately
            # took instead feeds back on itself: one late wake-up and the class runs whole cycles, then owes.)
            wait = min(allowed / cores, cap)
            while True:
                left = cycle_end - clock()
                if left <= 0:
                    break
                sleep(min(left, max(MIN_SLEEP_S, wait)))
                spent = cpu() - used_at
                if spent >= allowed:
                    freeze(True)
                    frozen = True
                    frozen_cycles += 1
                    break
                left_per_process = _cores_left(_used(threads_at, read_threads()), cap, cores)
                hot = {pid for pid, left_s in left_per_process.items() if left_s <= 0} - capped
                if hot:  # processes that used as many cores' shares as they ran threads: stopped, the rest run on
                    freeze(True, hot)
                    hot_cycles += not capped
                    capped |= hot
                    frozen = True
                running = [left_s for pid, left_s in left_per_process.items() if pid not in capped]
                wait = min([(allowed - spent) / cores, *running])
        else:  # still owing: stop whatever became busy since (a process that was asleep when the class stopped)
            freeze(True)
            frozen_cycles += not frozen
            frozen = True
        left = cycle_end - clock()
        if left > 0:
            sleep(left)
        now_used, now_threads = cpu(), read_threads()
        budget.settle(now_used - used_at)
        per_thread.settle(max(_used(threads_at, now_threads).values(), default=0.0))
        used_at, threads_at = now_used, now_threads
    if frozen:
        freeze(False)
    return {"cycles": total_cycles, "frozen_cycles": frozen_cycles, "cycles_hot": hot_cycles,
            "wall_s": clock() - began}


@dataclass
class StopBusy:
    """Stops (SIGSTOP) only the class's processes that used CPU since the last thaw, and continues them.

    Freezing the whole cgroup also stops the processes that sleep, and wakes each of them every cycle
    to do so; beside CPU-bound processes in the class, the kernel's scheduler then hardly ever runs a
    woken sleeper before the next freeze (measured: a process that wakes every 5 ms for 0.2 ms got 33
    of its 566 turns beside two busy loops in rpi4-class, waiting up to 0.6 s). A sleeping process is
    left alone: if it wakes while the others are stopped it runs, and what it used is owed."""

    cpu: ClassCpu
    kill: Callable[[int, int], None] = os.kill
    stopped: list[int] = field(default_factory=list)
    mark: dict[int, float] = field(default_factory=dict)

    def __call__(self, on: bool, only: set[int] | None = None) -> None:
        """Stop (``on``) the busy processes, or of them only those in ``only``; or continue all stopped."""
        if on:  # again while stopped: also stops what became busy since
            busy = [pid for pid in self.cpu.pids()
                    if self.cpu.seen.get(pid, 0.0) > self.mark.get(pid, -1.0) and pid not in self.stopped
                    and (only is None or pid in only)]
            for pid in busy:
                with contextlib.suppress(ProcessLookupError):
                    self.kill(pid, signal.SIGSTOP)
            self.stopped += busy
        else:
            for pid in self.stopped:
                with contextlib.suppress(ProcessLookupError):
                    self.kill(pid, signal.SIGCONT)
            self.stopped = []
            self.mark = dict(self.cpu.seen)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (4, 5) or args[4:] not in ([], ["per-core"]):
        print(__doc__, file=sys.stderr)
        return 2
    procs, cpu_budget, cores, cycle_us = Path(args[0]), float(args[1]), int(args[2]), int(args[3])
    per_core = args[4:] == ["per-core"]
    with contextlib.suppress(PermissionError, OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # wake on time; sleeps most of the cycle
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    cpu = ClassCpu(procs)
    stopper = StopBusy(cpu)
    t0, c0 = time.monotonic(), cpu()
    print("pacing", flush=True)  # the class may start: its budget is kept from now on
    try:
        stats = pace(stopper, cpu, cpu_budget=cpu_budget, cores=cores, cycle_s=cycle_us / 1e6,
                     stop=lambda: bool(stopping), threads=cpu.threads if per_core else None)
    finally:
        stopper(False)
        for pid in cpu.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    report: dict[str, float | bool | str] = dict(stats)
    class_cpu_s = cpu() - c0
    report["class_cpu_s"] = class_cpu_s
    clocks = cpu.read_clock
    if isinstance(clocks, ProcessCpu):  # tick-stale process clocks (no perf) let the class overshoot
        report["exact_cpu_clock"] = clocks.exact
        report["per_core_cap"] = per_core and clocks.exact  # needs the per-thread counters
        if clocks.refused:
            report["perf_refused"] = clocks.refused
    report["delivered_cpu_s_per_s"] = class_cpu_s / max(1e-9, time.monotonic() - t0)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
