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
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
MAX_CPU_INDEX = 1 << 16  # a cpuset list naming a higher core is odd, not a machine


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


def cpu_capacity(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP,
                 affinity: Collection[int] | None = None) -> CpuCapacity:
    """This process's CPU capacity (see the module's text); never raises for what the files hold."""
    allowed = set(affinity) if affinity is not None else allowed_cpus()
    cores = set(allowed)
    notes: list[str] = []
    sources: list[str] = []
    quotas: list[float] = []
    v2_path, v1, member_notes = _memberships(self_cgroup)
    notes += member_notes
    v2_mount = next((m for m in (root, root / "unified") if (m / "cgroup.controllers").is_file()), None)
    cpu_mount, cpu_path = _v1_mount(root, v1, "cpu")
    cpuset_mount, cpuset_path = _v1_mount(root, v1, "cpuset")

    def quota(where: Path, value: float | None) -> None:
        if value is not None:
            quotas.append(value)
            sources.append(f"{where.name} {value:g} cores")

    if cpu_mount is not None:
        for folder in _chain(cpu_mount, cpu_path):
            q, p = _read(folder / "cpu.cfs_quota_us", notes), _read(folder / "cpu.cfs_period_us", notes)
            if q is None or p is None:
                continue
            try:
                quota(folder / "cpu.cfs_quota_us", _quota_v1(q, p))
            except ValueError as exc:
                notes.append(f"{folder}: cpu.cfs_quota_us {q.strip()!r} / cpu.cfs_period_us {p.strip()!r} "
                             f"is not a quota ({exc}); skipped")
    elif v2_mount is not None:
        for folder in _chain(v2_mount, v2_path or "/"):
            text = _read(folder / "cpu.max", notes)
            if text is None:
                continue
            try:
                quota(folder / "cpu.max", _quota_v2(text))
            except ValueError as exc:
                notes.append(f"{folder / 'cpu.max'}: {text.strip()!r} is not 'QUOTA PERIOD' ({exc}); skipped")
    if cpuset_mount is not None:
        folder = _chain(cpuset_mount, cpuset_path)[0]
        listing = [folder / "cpuset.effective_cpus", folder / "cpuset.cpus"]
    elif v2_mount is not None:
        listing = [_chain(v2_mount, v2_path or "/")[0] / "cpuset.cpus.effective"]
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
    return CpuCapacity(cpus=max(1, len(cores)), quota_cores=min(quotas) if quotas else None, source=source,
                       notes=tuple(notes))


def thread_share(concurrency: int, capacity: CpuCapacity | None = None) -> int:
    """Threads one inference may use when ``concurrency`` of them run at once within this process's
    CPU capacity (:func:`cpu_capacity` when not given): whole cores each, at least one."""
    cores = (capacity if capacity is not None else cpu_capacity()).cores
    return max(1, int(cores // max(1, concurrency)))
