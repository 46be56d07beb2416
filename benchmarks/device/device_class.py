"""Emulated device classes: a command run under a CPU budget on pinned cores.

    python -m benchmarks.device.device_class CLASS [--] COMMAND [ARGS ...]
    python -m benchmarks.device.device_class --check        # what this machine's cgroups allow

No edge board is lent, so each target's speed class is emulated on x86: ``cpuset`` pins the command
to the class's cores and its CPU time is held to the class's budget (CPU-seconds per second). Two
mechanisms (``DeviceClass.mechanism``):

* ``pacer`` (the default): the class's busy processes stopped and continued every millisecond, paced
  by the class's own CPU time (``benchmarks/device/pacer.py``). Over anything longer than a few cycles
  the class is a uniformly slower CPU. The budget is a pool: one thread alone may use more than one
  core's share (in nano-class 0.8 of a core, where a board core at 40 % gives 0.4). ``--per-core``
  (``DeviceClass.per_core``) also holds each process to a core's share per thread it runs, so one
  thread gets 0.41; it is not the default: an ORT run of two spinning threads then composes worse
  (its blocks timed alone sum to 2.1x the whole variant, against 1.4x pooled; ``pacer.pace``);
* ``cfs``: the kernel's CFS quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``).
  The kernel enforces it at its scheduler tick (4 ms at HZ=250), whatever the period: a class at 25 %
  runs a tick at full speed, then is throttled while it repays the tick's debt (about 12 ms). An
  inference of a few ms is then either unthrottled or stalled, which no slow board does
  (``benchmarks/device/class_throttle.py`` measures both). Kept to measure that.

A class also gets a high CPU weight (v2 ``cpu.weight``, v1 ``cpu.shares``): a board does not share its
cores with other people's jobs, so on a shared machine the class should receive its whole budget,
and the budget keeps it from receiving more. What this does not emulate: the board's instruction
set, caches, memory bandwidth and clock (an x86 core at 25 % is not a Cortex-A72); it emulates a
speed class, measured, in place of a datasheet estimate.

Classes (``CLASSES``): ``rpi4-class`` one core at 25 %; ``nano-class`` two cores at 40 % each.
Needs root and a writable cgroup hierarchy (v2 with the cpu and cpuset controllers, or v1's cpu and
cpuset hierarchies); :func:`check` says which and why not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.device import pacer

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cfs mechanism: the kernel's smallest quota is 1 ms, so 25 % needs a period of at least 4 ms. The period
# hardly matters below the tick (the quota is checked at ticks); on two cores a 4 ms period delivers
# about 0.6 of a 0.8 budget (the kernel's 5 ms bandwidth slice). --check reports what a class delivered.
MIN_QUOTA_US = 1_000
PERIOD_US = 4_000
MECHANISMS = ("pacer", "cfs")
CLASS_WEIGHT_V1 = 10_240  # cpu.shares (default 1024)
CLASS_WEIGHT_V2 = 1_000  # cpu.weight (default 100)


@dataclass(frozen=True)
class DeviceClass:
    name: str
    cpus: tuple[int, ...]
    share_per_core: float
    emulates: str
    mechanism: str = "pacer"
    period_override_us: int | None = None  # cfs: a measurement's own period (class_throttle); pacer: its cycle
    per_core: bool = False  # pacer: also hold each process to a core's share per thread it runs (pacer.pace)

    @property
    def cycle_us(self) -> int:
        """The pacer's cycle: the longest stretch the class runs at full speed or stands frozen."""
        return self.period_override_us or pacer.CYCLE_US

    @property
    def period_us(self) -> int:
        if self.period_override_us is not None:
            return self.period_override_us
        return max(PERIOD_US, round(MIN_QUOTA_US / self.cpu_budget))

    @property
    def quota_us(self) -> int:
        return round(self.period_us * self.cpu_budget)

    @property
    def cpu_budget(self) -> float:
        """CPU cores' worth of time per second the class may use."""
        return self.share_per_core * len(self.cpus)

    def describe(self) -> str:
        cores = ",".join(str(c) for c in self.cpus)
        how = (f"CFS quota {self.quota_us} us per {self.period_us} us" if self.mechanism == "cfs" else
               f"paced every {self.cycle_us} us by the class's CPU time")
        return (f"{self.name}: core(s) {cores} at {self.share_per_core:.0%} each ({how}), "
                f"the speed class of {self.emulates}")


CLASSES = {
    "rpi4-class": DeviceClass("rpi4-class", (0,), 0.25, "a Raspberry Pi 4B-class CPU budget"),
    "nano-class": DeviceClass("nano-class", (0, 1), 0.40, "a Jetson Nano-class CPU (its four A57 cores, scaled)"),
}


class CgroupUnavailable(RuntimeError):
    """This machine's cgroups cannot be written (not root, not mounted, controllers missing)."""


@dataclass(frozen=True)
class Layout:
    version: int
    cpu: Path  # parent folder the class's cpu cgroup goes under
    cpuset: Path


def layout(root: Path = CGROUP_ROOT) -> Layout:
    """Where class cgroups can be made: cgroup v2 (one tree) or v1 (cpu and cpuset trees)."""
    controllers = root / "cgroup.controllers"
    if controllers.is_file():
        have = set(controllers.read_text().split())
        missing = {"cpu", "cpuset"} - have
        if missing:
            raise CgroupUnavailable(f"cgroup v2 at {root} lacks the {', '.join(sorted(missing))} controller(s)")
        return Layout(2, root, root)
    cpu, cpuset = root / "cpu", root / "cpuset"
    if (cpu / "cpu.cfs_quota_us").is_file() and (cpuset / "cpuset.cpus").is_file():
        return Layout(1, cpu, cpuset)
    raise CgroupUnavailable(f"no cgroup v2 with cpu+cpuset and no v1 cpu and cpuset hierarchies under {root}")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupUnavailable(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from exc


def _start_pacer(device_class: DeviceClass, procs_file: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "benchmarks.device.pacer", str(procs_file), str(device_class.cpu_budget),
            str(len(device_class.cpus)), str(device_class.cycle_us), *(["per-core"] if device_class.per_core else [])]
    path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=path))
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"pacing":  # nothing may run in the class before the pacer does
        proc.kill()
        _, err = proc.communicate()
        raise CgroupUnavailable(f"the pacer did not start: {err.decode()[-500:]}")
    return proc


def _stop_pacer(proc: subprocess.Popen[bytes], procs_file: Path, delivered: dict[str, Any] | None) -> None:
    proc.terminate()
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    with contextlib.suppress(OSError, ValueError):
        for pid in procs_file.read_text().split():  # never leave a class's process stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGCONT)
    if delivered is not None:
        try:
            delivered.update(json.loads(out.decode().strip().splitlines()[-1]))
        except (ValueError, IndexError):
            delivered["pacer_error"] = err.decode()[-500:] or f"pacer exited {proc.returncode}"


@contextmanager
def class_cgroup(device_class: DeviceClass, *, root: Path = CGROUP_ROOT,
                 delivered: dict[str, Any] | None = None) -> Iterator[list[Path]]:
    """Make the class's cgroup(s) and yield the ``cgroup.procs`` files a process joins; removed after.

    With the pacer mechanism, the pacer runs (outside the class) while the block is open; what it
    delivered (``pacer.main``'s figures) goes into ``delivered`` when given."""
    where = layout(root)
    name = f"hmt-{device_class.name}-{os.getpid()}-{time.monotonic_ns()}"
    made: list[Path] = []
    paced = device_class.mechanism == "pacer"
    quota, period = (device_class.quota_us, device_class.period_us) if not paced else (-1, PERIOD_US)
    pacer_proc = None
    try:
        if where.version == 2:
            _write(root / "cgroup.subtree_control", "+cpu +cpuset")
            group = root / name
            group.mkdir()
            made.append(group)
            _write(group / "cpuset.cpus", ",".join(str(c) for c in device_class.cpus))
            _write(group / "cpu.max", f"{'max' if quota < 0 else quota} {period}")
            _write(group / "cpu.weight", str(CLASS_WEIGHT_V2))
            procs = [group / "cgroup.procs"]
        else:
            cpu, cpuset = where.cpu / name, where.cpuset / name
            for group in (cpu, cpuset):
                group.mkdir()
                made.append(group)
            _write(cpuset / "cpuset.cpus", ",".join(str(c) for c in device_class.cpus))
            _write(cpuset / "cpuset.mems", (where.cpuset / "cpuset.mems").read_text().strip() or "0")
            _write(cpu / "cpu.cfs_period_us", str(period))
            _write(cpu / "cpu.cfs_quota_us", str(quota))
            _write(cpu / "cpu.shares", str(CLASS_WEIGHT_V1))
            procs = [cpu / "cgroup.procs", cpuset / "cgroup.procs"]
        if paced:
            pacer_proc = _start_pacer(device_class, procs[0])
        yield procs
    except PermissionError as exc:
        raise CgroupUnavailable(f"cannot create a cgroup under {root}: {exc}") from exc
    finally:
        if pacer_proc is not None:
            _stop_pacer(pacer_proc, procs[0], delivered)
        _empty(made)
        for group in reversed(made):
            with contextlib.suppress(OSError):
                group.rmdir()  # only our own, empty once its processes have exited


def _pids(groups: Sequence[Path]) -> set[int]:
    pids: set[int] = set()
    for group in groups:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in (group / "cgroup.procs").read_text().split())
    return pids


def _empty(groups: Sequence[Path], wait_s: float = 5.0) -> None:
    """Kill what is left in the class's cgroups (a command stopped by a signal leaves its children:
    a server, its clients, burners, some of them stopped by the pacer), so that the cgroups can go.
    Everything in them was started inside the class by this module."""
    deadline = time.monotonic() + wait_s
    while (pids := _pids(groups)) and time.monotonic() < deadline:
        for pid in pids:
            for sig in (signal.SIGKILL, signal.SIGCONT):  # a stopped process dies once continued
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        time.sleep(0.05)


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM (``kill``, a CI job's timeout) raises SystemExit in the main thread while the block
    runs, so that the class's ``finally`` stops the pacer, kills what is left and removes its cgroups
    (the default action ends the process at once and leaves them, some of its processes stopped)."""
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _joiner(procs: Sequence[Path]):  # type: ignore[no-untyped-def]
    def join() -> None:
        for path in procs:
            path.write_text("0")  # "0": the writing process itself, before it execs the command

    return join


def popen_in_class(device_class: DeviceClass, procs: Sequence[Path], argv: Sequence[str],
                   **kwargs: object) -> subprocess.Popen[bytes]:
    """Start ``argv`` inside the class (it joins the cgroups before exec, so every child it makes does too)."""
    return subprocess.Popen(list(argv), preexec_fn=_joiner(procs), **kwargs)  # type: ignore[call-overload]


def run_in_class(device_class: DeviceClass, argv: Sequence[str], *, root: Path = CGROUP_ROOT,
                 timeout_s: float | None = None, delivered: dict[str, Any] | None = None,
                 **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    with class_cgroup(device_class, root=root, delivered=delivered) as procs:
        proc = popen_in_class(device_class, procs, argv, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def child_error(stderr: str, limit: int = 3000) -> str:
    """What a failed child said: from its last traceback on (warnings printed at shutdown, such as the
    resource tracker's, come after it and hid the cause when only the end was kept)."""
    start = stderr.rfind("Traceback (most recent call last)")
    text = stderr[start:] if start >= 0 else stderr
    return text[:limit] if start >= 0 else text[-limit:]


def cpu_seconds_per_second(device_class: DeviceClass, seconds: float = 2.0) -> float:
    """Measured CPU seconds per second that busy loops inside the class get, one per class core (its
    budget, if the controller works: one loop alone gets one core's share and more, never the class's)."""
    code = ("import os,time\nkids=[]\n"
            f"for _ in range({len(device_class.cpus)}):\n"
            "    pid=os.fork()\n"
            "    if pid==0:\n"
            f"        t0=time.time()\n        while time.time()-t0<{seconds}: pass\n        os._exit(0)\n"
            "    kids.append(pid)\n"
            "t0=time.time()\nfor k in kids: os.waitpid(k,0)\n"
            "c=os.times()\nprint((c.children_user+c.children_system)/(time.time()-t0))")
    done = run_in_class(device_class, [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        timeout_s=seconds + 30)
    out = done.stdout.decode().strip()
    try:
        return float(out)
    except ValueError:
        raise RuntimeError(f"{device_class.name}: the busy-loop check inside the class gave no figure (exit code "
                           f"{done.returncode}, output {out!r}): {child_error(done.stderr.decode())}") from None


def check() -> str:
    """One line per class: the cgroup layout and the busy loop's measured CPU share, or why not."""
    try:
        where = layout()
    except CgroupUnavailable as exc:
        return f"cgroups unavailable: {exc}"
    if os.geteuid() != 0:
        return f"cgroup v{where.version} found, but writing it needs root"
    lines = [f"cgroup v{where.version} (cpu: {where.cpu}, cpuset: {where.cpuset})"]
    for device_class in CLASSES.values():
        try:
            share = cpu_seconds_per_second(device_class)
        except CgroupUnavailable as exc:
            lines.append(f"{device_class.name}: {exc}")
            continue
        lines.append(f"{device_class.describe()}: a busy loop got {share:.2f} CPU s/s "
                     f"(budget {device_class.cpu_budget:.2f})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="say what this machine's cgroups allow, and exit")
    parser.add_argument("--per-core", action="store_true",
                        help="pacer: also hold each process to one core's share per thread it runs")
    parser.add_argument("--cpus", default=None,
                        help="host cores to pin the class to, comma-separated, as many as the class has "
                             "(default: the class's own, from core 0): two runs side by side on other cores")
    parser.add_argument("device_class", nargs="?", choices=sorted(CLASSES))
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.check:
        print(check())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.device_class is None or not command:
        parser.error("give a class and a command: CLASS -- COMMAND [ARGS ...]")
    device_class = replace(CLASSES[args.device_class], per_core=args.per_core)
    if args.cpus is not None:
        try:
            cpus = tuple(int(c) for c in args.cpus.split(","))
        except ValueError:
            parser.error(f"--cpus {args.cpus!r}: expected core numbers separated by commas, e.g. 1 or 0,1")
        if len(cpus) != len(device_class.cpus) or len(set(cpus)) != len(cpus):
            parser.error(f"--cpus {args.cpus!r}: {device_class.name} has {len(device_class.cpus)} distinct core(s)")
        device_class = replace(device_class, cpus=cpus)
    try:
        with terminate_as_exit(), class_cgroup(device_class) as procs:
            return popen_in_class(device_class, procs, command).wait()
    except CgroupUnavailable as exc:
        print(f"device_class: {exc}", file=sys.stderr)
        return 7


if __name__ == "__main__":
    sys.exit(main())
