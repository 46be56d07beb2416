"""The CPU capacity this process may use: the cores it may run on and its cgroup's CPU quota.

A process inside a CPU-limited cgroup (a container with ``--cpus``, a device class emulated with
``cpuset`` and ``cpu.max``) has less CPU than the machine it sees in ``os.cpu_count()``. What it has:

* its cores: the CPU affinity (which a cpuset already narrows), intersected with the cgroup's cpuset
  list (cgroup v2 ``cpuset.cpus.effective``, v1 ``cpuset.effective_cpus`` or ``cpuset.cpus``);
* its quota: cores' worth of CPU time per second, ``QUOTA / PERIOD`` (v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), the smallest over the cgroup and its ancestors;
  "max" (v2) or -1 (v1) is no quota.

``CpuCapacity.cores`` is the smaller of the two. A cgroup file that cannot be read or holds something
unexpected is skipped and said so in ``notes``; with nothing readable the capacity is the affinity
count. The cgroup a process is in comes from ``/proc/self/cgroup`` (``ID:CONTROLLERS:PATH``);
folders of that path missing under the mount (a container that shows its own cgroup as the root) are
skipped, and the mount's top folder is read in any case.

:class:`CgroupCpuTime` reads the CPU time the processes under the binding quota have used (v2
``cpu.stat``, v1 ``cpuacct.usage``, else their ``/proc`` stat), so a share of the quota can be measured:
what the processes of the cgroup use of it, not how busy its cores are (other cgroups run there too).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
PROC_ROOT = Path("/proc")
MAX_CPU_INDEX = 1 << 16  # a cpuset list naming a higher core is odd, not a machine
MAX_TASKS = 512  # CgroupCpuTime: tasks whose /proc stat one reading may open
MAX_GROUPS = 64  # CgroupCpuTime: cgroups (the quota's and those below it) one reading may list
MAX_NOTES = 20  # CgroupCpuTime: notes kept (each said once)


@dataclass(frozen=True)
class CpuCapacity:
    cpus: int  # cores this process may run on
    quota_cores: float | None = None  # cgroup quota, cores' worth of CPU time per second; None = no quota
    source: str = "affinity"  # what set the figures, in words
    notes: tuple[str, ...] = ()  # cgroup files that were skipped, and why

    @property
    def cores(self) -> float:
        """Cores' worth of CPU time per second this process may use."""
        if self.quota_cores is None:
            return float(self.cpus)
        return min(float(self.cpus), self.quota_cores)

    def describe(self) -> str:
        quota = "no quota" if self.quota_cores is None else f"quota {self.quota_cores:g} cores"
        return f"{self.cores:g} cores of CPU ({self.cpus} core(s), {quota}; from {self.source})"


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list such as ``0-1,3`` as a set of core numbers; ValueError if it is not one."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo_text, sep, hi_text = part.partition("-")
        lo, hi = int(lo_text), int(hi_text) if sep else int(lo_text)
        if lo < 0 or hi < lo or hi >= MAX_CPU_INDEX:
            raise ValueError(f"bad range {part!r}")
        cores.update(range(lo, hi + 1))
    return cores


def _quota_v2(text: str) -> float | None:
    fields = text.split()
    if len(fields) != 2:
        raise ValueError("expected 'QUOTA PERIOD' or 'max PERIOD'")
    period = int(fields[1])
    if period <= 0:
        raise ValueError(f"period {period} is not positive")
    if fields[0] == "max":
        return None
    quota = int(fields[0])
    if quota <= 0:
        raise ValueError(f"quota {quota} is not positive")
    return quota / period


def _quota_v1(quota_text: str, period_text: str) -> float | None:
    quota, period = int(quota_text.strip()), int(period_text.strip())
    if quota == -1:
        return None
    if quota <= 0 or period <= 0:
        raise ValueError(f"quota {quota} / period {period}: expected -1 or positive numbers")
    return quota / period


@dataclass(frozen=True)
class _Quota:
    folder: Path  # the cgroup holding it
    file: Path  # the file it was read from
    cores: float  # cores' worth of CPU time per second
    version: int  # cgroup version, 1 or 2


@dataclass(frozen=True)
class _Groups:
    """Where this process's cgroups are: the v2 mount and path, the v1 paths, the v1 cpu mount and path."""

    v2_mount: Path | None
    v2_path: str
    v1: dict[str, str]
    cpu_mount: Path | None
    cpu_path: str


def _memberships(self_cgroup: Path) -> tuple[str | None, dict[str, str], list[str]]:
    """(the v2 path, {v1 controller set: path}, notes) from ``/proc/self/cgroup``."""
    notes: list[str] = []
    v2: str | None = None
    v1: dict[str, str] = {}
    try:
        text = self_cgroup.read_text()
    except OSError as exc:
        return None, v1, [f"{self_cgroup}: cannot read ({exc.strerror or exc}); the cgroup's top folders only"]
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            if line.strip():
                notes.append(f"{self_cgroup}: skipped the line {line!r} (expected ID:CONTROLLERS:/PATH)")
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        else:
            v1[parts[1]] = parts[2]
    return v2, v1, notes


def _chain(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and its ancestors under ``mount``, leaf first, only those that exist; the
    mount itself always last."""
    rel = PurePosixPath(path).relative_to("/")
    if ".." in rel.parts:  # not a cgroup path the kernel writes: nothing outside the mount is read
        return [mount]
    chain = [mount / str(p) for p in [rel, *rel.parents] if str(p) != "."]
    return [d for d in chain if d.is_dir()] + [mount]


def _v1_mount(root: Path, v1: dict[str, str], controller: str) -> tuple[Path | None, str]:
    for controllers, path in v1.items():
        names = controllers.split(",")
        if controller in names:
            for candidate in (root / controllers, root / controller):
                if candidate.is_dir():
                    return candidate, path
    return None, "/"


def _read(path: Path, notes: list[str]) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"{path}: cannot read ({exc.strerror or exc}); skipped")
        return None


def allowed_cpus() -> set[int]:
    """The cores this process may run on (its affinity; every core where that cannot be read)."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is not None:
        try:
            return set(getter(0))
        except OSError:
            pass
    return set(range(os.cpu_count() or 1))


def _quotas(root: Path, self_cgroup: Path, notes: list[str]) -> tuple[list[_Quota], _Groups]:
    """Every quota over the process's cpu cgroup and its ancestors (v1 where the cpu controller is on a
    v1 hierarchy, else v2), leaf first; and where its cgroups are."""
    v2_path, v1, member_notes = _memberships(self_cgroup)
    notes += member_notes
    v2_mount = next((m for m in (root, root / "unified") if (m / "cgroup.controllers").is_file()), None)
    cpu_mount, cpu_path = _v1_mount(root, v1, "cpu")
    groups = _Groups(v2_mount, v2_path or "/", v1, cpu_mount, cpu_path)
    found: list[_Quota] = []
    if cpu_mount is not None:
        for folder in _chain(cpu_mount, cpu_path):
            q, p = _read(folder / "cpu.cfs_quota_us", notes), _read(folder / "cpu.cfs_period_us", notes)
            if q is None or p is None:
                continue
            try:
                value = _quota_v1(q, p)
            except ValueError as exc:
                notes.append(f"{folder}: cpu.cfs_quota_us {q.strip()!r} / cpu.cfs_period_us {p.strip()!r} "
                             f"is not a quota ({exc}); skipped")
                continue
            if value is not None:
                found.append(_Quota(folder, folder / "cpu.cfs_quota_us", value, version=1))
    elif v2_mount is not None:
        for folder in _chain(v2_mount, groups.v2_path):
            text = _read(folder / "cpu.max", notes)
            if text is None:
                continue
            try:
                value = _quota_v2(text)
            except ValueError as exc:
                notes.append(f"{folder / 'cpu.max'}: {text.strip()!r} is not 'QUOTA PERIOD' ({exc}); skipped")
                continue
            if value is not None:
                found.append(_Quota(folder, folder / "cpu.max", value, version=2))
    return found, groups


def _given_quota(groups: _Groups, cores: float) -> _Quota | None:
    """A quota given by the caller (a paced CPU, a hypervisor's cap: no kernel file holds it), charged
    to this process's own cpu cgroup (v1 where the cpu controller is on a v1 hierarchy, else v2)."""
    if not (math.isfinite(cores) and cores > 0):
        raise ValueError(f"a CPU quota must be a positive number of cores, got {cores!r}")
    if groups.cpu_mount is not None:
        folder = _chain(groups.cpu_mount, groups.cpu_path)[0]
        return _Quota(folder, folder, cores, version=1)
    if groups.v2_mount is not None:
        folder = _chain(groups.v2_mount, groups.v2_path)[0]
        return _Quota(folder, folder, cores, version=2)
    return None


def cpu_capacity(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP,
                 affinity: Collection[int] | None = None) -> CpuCapacity:
    """This process's CPU capacity (see the module's text); never raises for what the files hold."""
    allowed = set(affinity) if affinity is not None else allowed_cpus()
    cores = set(allowed)
    notes: list[str] = []
    quotas, groups = _quotas(root, self_cgroup, notes)
    sources = [f"{q.file.name} {q.cores:g} cores" for q in quotas]
    cpuset_mount, cpuset_path = _v1_mount(root, groups.v1, "cpuset")
    if cpuset_mount is not None:
        folder = _chain(cpuset_mount, cpuset_path)[0]
        listing = [folder / "cpuset.effective_cpus", folder / "cpuset.cpus"]
    elif groups.v2_mount is not None:
        listing = [_chain(groups.v2_mount, groups.v2_path)[0] / "cpuset.cpus.effective"]
    else:
        listing = []
    for path in listing:
        text = _read(path, notes)
        if text is None or not text.strip():
            continue
        try:
            listed = parse_cpu_list(text)
        except ValueError as exc:
            notes.append(f"{path}: {text.strip()!r} is not a CPU list such as '0-1,3' ({exc}); skipped")
            continue
        if listed & cores:
            if listed & cores != cores:
                sources.append(f"cpuset {text.strip()}")
            cores &= listed
        else:
            notes.append(f"{path}: {text.strip()!r} shares no core with the affinity {sorted(allowed)}; skipped")
        break
    source = "affinity" + "".join(f", {s}" for s in sources)
    return CpuCapacity(cpus=max(1, len(cores)), quota_cores=min(q.cores for q in quotas) if quotas else None,
                       source=source, notes=tuple(notes))


def thread_share(concurrency: int, capacity: CpuCapacity | None = None) -> int:
    """Threads one inference may use when ``concurrency`` of them run at once within this process's
    CPU capacity (:func:`cpu_capacity` when not given): whole cores each, at least one."""
    cores = (capacity if capacity is not None else cpu_capacity()).cores
    return max(1, int(cores // max(1, concurrency)))


def _cpu_stat_usage_us(text: str) -> int:
    """``usage_usec`` of a cgroup v2 ``cpu.stat``; ValueError if it has none."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "usage_usec":
            return int(fields[1])
    raise ValueError("no 'usage_usec' line")


def parse_task_stat(text: str) -> tuple[int, int]:
    """(start time, utime + stime) of a ``/proc/PID/stat`` line, both in clock ticks; ValueError if it is
    not one. The command name (field 2, in parentheses) may hold spaces and parentheses itself."""
    rest = text[text.rindex(")") + 1:].split()  # rest[0] is field 3 (the state)
    if len(rest) < 20:
        raise ValueError(f"{len(rest) + 2} fields, expected 22 or more")
    return int(rest[19]), int(rest[11]) + int(rest[12])


class CgroupCpuTime:
    """The CPU time used by every process under the cgroup whose CPU quota binds this process.

    Calling it gives that time in seconds, cumulative from an arbitrary start (only differences
    between two calls mean anything), or ``None`` when this process has no quota or the reading
    failed; it never raises for what the files hold. The cgroup is the one with the smallest quota
    over this process's cgroup and its ancestors (:func:`cpu_capacity`), so what is counted is what
    that quota is charged with: this process, the processes beside it and those in the cgroups below.
    It is read, in this order of preference (``source`` says which):

    * cgroup v2: that cgroup's ``cpu.stat`` ``usage_usec``;
    * cgroup v1: ``cpuacct.usage`` (ns) of the same cgroup in the cpuacct hierarchy, where cpuacct is
      mounted with cpu or this process is at the same path in both (the two hierarchies are then taken
      to group the same processes). A cpuacct hierarchy of its own, where the quota's cgroup does not
      exist or this process is elsewhere, counts other processes, so it is not read;
    * otherwise the sum over the cgroup's tasks (v1 ``tasks``, per thread from
      ``/proc/TID/task/TID/stat``; v2 ``cgroup.procs``, per process from ``/proc/PID/stat``), in that
      cgroup and those below it, of a thread's ``schedstat`` time (ns) or else utime + stime (ticks:
      10 ms, coarse for a reading of a quarter core every 0.25 s). Tasks come and go, so the sum of their totals is no
      counter: each reading adds each task's time since the previous reading (a task seen before, by
      id and start time); a task seen for the first time adds its whole time if it started after the
      previous reading (it all falls between the two), else nothing (it was moved in, or this is the
      first reading). A task that exits between two readings loses what it used since the previous
      one, so the figure is a little low under short-lived tasks. More than ``max_tasks`` tasks (or
      ``MAX_GROUPS`` cgroups) and the reading gives ``None`` and says so in ``notes``.

    ``quota_cores`` adds a quota no kernel file holds (a CPU paced from outside, a hypervisor's cap),
    charged to this process's own cgroup; the smallest quota still binds.
    """

    def __init__(self, root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP, *, proc_root: Path = PROC_ROOT,
                 max_tasks: int = MAX_TASKS, ticks_per_s: int | None = None,
                 quota_cores: float | None = None) -> None:
        notes: list[str] = []
        quotas, groups = _quotas(root, self_cgroup, notes)
        if quota_cores is not None:  # a quota the caller knows of and no kernel file holds: this cgroup's
            given = _given_quota(groups, quota_cores)
            if given is None:
                notes.append("no cgroup of this process was found for the given CPU quota; not read")
            else:
                quotas.append(given)
        self.notes = notes  # files skipped and readings given up, and why (each said once)
        quota = min(quotas, key=lambda q: q.cores) if quotas else None
        self.quota_cores = None if quota is None else quota.cores  # the binding quota, cores' worth per second
        self.quota_group = None if quota is None else quota.folder  # the cgroup holding it
        self.source = "none (no CPU quota)"  # what the figure is read from, in words
        self._proc_root = proc_root
        self._max_tasks = max_tasks
        self._ticks_per_s = ticks_per_s or _clock_ticks_per_s()
        self._counter: tuple[Path, float] | None = None  # (file, its unit in seconds)
        self._tasks: tuple[str, bool] | None = None  # (listing file name, per thread)
        self._last: dict[int, tuple[int, int]] = {}  # task id -> (start in ticks, used in ns) at the last reading
        self._last_uptime_ticks: int | None = None
        self._used_ns = 0
        self._lock = threading.Lock()  # a reading of the tasks updates what the next one adds to
        if quota is None:
            return
        counter = (quota.folder / "cpu.stat", 1e-6) if quota.version == 2 else self._cpuacct(root, groups, quota)
        if counter is not None and self._read_counter(counter) is not None:
            self._counter = counter
            self.source = f"{counter[0]}"
        else:
            self._tasks = ("tasks", True) if quota.version == 1 else ("cgroup.procs", False)
            self.source = f"{quota.folder / self._tasks[0]} (CPU time of each task)"

    def _cpuacct(self, root: Path, groups: _Groups, quota: _Quota) -> tuple[Path, float] | None:
        """v1: the quota cgroup's ``cpuacct.usage`` (ns), where the cpuacct hierarchy groups as the cpu one."""
        acct_mount, acct_path = _v1_mount(root, groups.v1, "cpuacct")
        if acct_mount is None or groups.cpu_mount is None:
            return None
        if acct_mount != groups.cpu_mount and acct_path != groups.cpu_path:
            self._note(f"{acct_mount}: this process's cpuacct cgroup {acct_path} is not its cpu cgroup "
                       f"{groups.cpu_path}; its usage is not what the quota is charged with")
            return None
        return acct_mount / quota.folder.relative_to(groups.cpu_mount) / "cpuacct.usage", 1e-9

    def _note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < MAX_NOTES:
            self.notes.append(text)

    def _read_counter(self, counter: tuple[Path, float]) -> float | None:
        path, unit_s = counter
        try:
            text = path.read_text()
            return (_cpu_stat_usage_us(text) if path.name == "cpu.stat" else int(text.strip())) * unit_s
        except OSError as exc:
            self._note(f"{path}: cannot read ({exc.strerror or exc})")
        except ValueError as exc:
            self._note(f"{path}: not a CPU time ({exc})")
        return None

    def __call__(self) -> float | None:
        if self._counter is not None:
            return self._read_counter(self._counter)
        if self._tasks is None or self.quota_group is None:
            return None
        try:
            with self._lock:
                used = self._read_tasks(self.quota_group, *self._tasks)
        except (OSError, ValueError, IndexError) as exc:  # a listing or /proc/uptime unreadable or odd
            self._note(f"{self.quota_group}: cannot sum its tasks' CPU time ({exc})")
            return None
        return None if used is None else used / 1e9

    def _task_used_ns(self, stat: Path, per_thread: bool) -> tuple[int, int]:
        """(start in ticks, CPU time in ns) of a task: a thread's ``schedstat`` (ns on the CPU) where it
        is readable, else its stat's utime + stime (whole ticks: a 0.25 s reading at a quarter core is
        six of them). ``/proc/PID/schedstat`` is the leader thread's alone, so a process's is not read."""
        start, used_ticks = parse_task_stat(stat.read_text())
        if per_thread:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return start, int((stat.parent / "schedstat").read_text().split()[0])
        return start, used_ticks * 1_000_000_000 // self._ticks_per_s

    def _read_tasks(self, folder: Path, listing: str, per_thread: bool) -> int | None:
        """The cumulative ns (see the class's text); None when there are too many tasks or cgroups."""
        uptime_ticks = int(float((self._proc_root / "uptime").read_text().split()[0]) * self._ticks_per_s)
        ids: list[int] = []
        for count, (where, subfolders, _) in enumerate(os.walk(folder)):
            subfolders.sort()
            if count >= MAX_GROUPS:
                self._note(f"{folder}: more than {MAX_GROUPS} cgroups below it; its CPU time is not summed")
                return None
            try:
                ids += [int(t) for t in (Path(where) / listing).read_text().split()]
            except FileNotFoundError:  # removed since the walk: it has no tasks left
                continue
            if len(ids) > self._max_tasks:
                self._note(f"{folder}: more than {self._max_tasks} tasks; their CPU time is not summed")
                return None
        last, since = self._last, self._last_uptime_ticks
        now: dict[int, tuple[int, int]] = {}
        for task in ids:
            task_dir = self._proc_root / str(task)
            stat = (task_dir / "task" / str(task) if per_thread else task_dir) / "stat"
            try:
                start, used = self._task_used_ns(stat, per_thread)
            except (OSError, ValueError):  # exited since the listing (or not a task): it adds nothing
                continue
            before = last.get(task)
            if before is not None and before[0] == start:
                self._used_ns += max(0, used - before[1])
            elif since is not None and start >= since:
                self._used_ns += used
            now[task] = (start, used)
        self._last, self._last_uptime_ticks = now, uptime_ticks
        return self._used_ns


def _clock_ticks_per_s() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, OSError, ValueError):
        return 100
