"""Emulated device classes (benchmarks/device/device_class.py): the cgroup files a class writes, on a
fake hierarchy, and, where this machine lets root write cgroups, the CPU budget a process really gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.device import device_class as dc


def _v1(root: Path) -> Path:
    for controller, files in (("cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares")),
                              ("cpuset", ("cpuset.cpus", "cpuset.mems"))):
        (root / controller).mkdir(parents=True)
        for name in files:
            (root / controller / name).write_text("0\n")
    return root


def test_classes_are_the_issue_budgets() -> None:
    rpi, nano = dc.CLASSES["rpi4-class"], dc.CLASSES["nano-class"]
    assert (rpi.cpus, rpi.cpu_budget, rpi.mechanism, rpi.cycle_us) == ((0,), 0.25, "pacer", 1_000)
    assert (nano.cpus, nano.cpu_budget, nano.mechanism) == ((0, 1), 0.8, "pacer")
    cfs = replace(rpi, mechanism="cfs")
    assert (cfs.quota_us, cfs.period_us) == (1_000, 4_000)  # the kernel's smallest quota at 25 %


def _group(root: Path, controller: str) -> Path:
    return next(p for p in (root / controller).iterdir() if p.is_dir())


def test_a_v1_cfs_class_writes_quota_cores_and_weight_and_removes_its_groups(tmp_path: Path) -> None:
    root = _v1(tmp_path / "cg")
    nano = replace(dc.CLASSES["nano-class"], mechanism="cfs")
    with dc.class_cgroup(nano, root=root) as procs:
        cpu, cpuset = _group(root, "cpu"), _group(root, "cpuset")
        assert cpu.name.startswith(f"hmt-nano-class-{os.getpid()}-")
        assert procs == [cpu / "cgroup.procs", cpuset / "cgroup.procs"]
        assert (cpu / "cpu.cfs_quota_us").read_text() == "3200"
        assert (cpu / "cpu.cfs_period_us").read_text() == "4000"
        assert (cpu / "cpu.shares").read_text() == str(dc.CLASS_WEIGHT_V1)
        assert (cpuset / "cpuset.cpus").read_text() == "0,1" and (cpuset / "cpuset.mems").read_text() == "0"
        for group in (cpu, cpuset):  # a real cgroup's files vanish with it; the fake's must go first
            for f in group.iterdir():
                f.unlink()
    assert not cpu.exists() and not cpuset.exists()


def test_a_paced_class_has_no_quota_and_runs_the_pacer_meanwhile(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = _v1(tmp_path / "cg")
    calls: list[tuple[str, Path]] = []
    monkeypatch.setattr(dc, "_start_pacer", lambda c, procs: calls.append(("start", procs)) or "proc")
    monkeypatch.setattr(dc, "_stop_pacer", lambda proc, procs, delivered: calls.append(("stop", procs)))
    with dc.class_cgroup(dc.CLASSES["rpi4-class"], root=root) as procs:
        cpu = _group(root, "cpu")
        assert (cpu / "cpu.cfs_quota_us").read_text() == "-1"
        assert calls == [("start", cpu / "cgroup.procs")] and procs[0] == cpu / "cgroup.procs"
        for group in (cpu, _group(root, "cpuset")):
            for f in group.iterdir():
                f.unlink()
    assert calls[-1] == ("stop", cpu / "cgroup.procs") and not cpu.exists()


def test_a_v2_cfs_class_writes_cpu_max(tmp_path: Path) -> None:
    root = tmp_path / "cg2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    with dc.class_cgroup(replace(dc.CLASSES["rpi4-class"], mechanism="cfs"), root=root) as procs:
        group = procs[0].parent
        assert (group / "cpu.max").read_text() == "1000 4000" and (group / "cpuset.cpus").read_text() == "0"
        assert (root / "cgroup.subtree_control").read_text() == "+cpu +cpuset"


def test_missing_controllers_are_named(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("io memory\n")
    with pytest.raises(dc.CgroupUnavailable, match="lacks the cpu, cpuset controller"):
        dc.layout(tmp_path)
    with pytest.raises(dc.CgroupUnavailable, match="no cgroup v2 with cpu\\+cpuset and no v1"):
        dc.layout(tmp_path / "nothing")


def _cgroups_writable() -> bool:
    try:
        dc.layout()
    except dc.CgroupUnavailable:
        return False
    return os.geteuid() == 0


@pytest.mark.slow
@pytest.mark.skipif(not _cgroups_writable(), reason="needs root and writable cpu/cpuset cgroups")
def test_a_busy_loop_inside_a_class_gets_its_budget() -> None:
    for name in ("rpi4-class", "nano-class"):
        share = dc.cpu_seconds_per_second(dc.CLASSES[name], seconds=1.5)
        budget = dc.CLASSES[name].cpu_budget
        assert 0.65 * budget <= share <= budget + 0.05, (name, share)  # a shared machine may not deliver it all
    done = subprocess.run([sys.executable, "-m", "benchmarks.device.device_class", "rpi4-class", "--", sys.executable,
                           "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0 and done.stdout.strip() == "[0]"


_BURN_PROBE = """
import json, os, time
import psutil
from hmt.serve.running.burn import LoadGenerator
gen = LoadGenerator()
gen.start()
try:
    gen.set(0.5)
    time.sleep(1.0)
    kids = psutil.Process().children()
    cgroups = [open(f"/proc/{k.pid}/cgroup").read() for k in kids]
    c0, t0 = sum(sum(k.cpu_times()[:2]) for k in kids), time.monotonic()
    time.sleep(2.0)
    c1, t1 = sum(sum(k.cpu_times()[:2]) for k in kids), time.monotonic()
    mine = open("/proc/self/cgroup").read()
    print(json.dumps({"processes": gen.processes, "duties": gen.duties, "same_cgroup": all(c == mine for c in cgroups),
                      "cpu_s_per_s": (c1 - c0) / (t1 - t0)}))
finally:
    gen.stop()
"""


@pytest.mark.slow
@pytest.mark.skipif(not _cgroups_writable(), reason="needs root and writable cpu/cpuset cgroups")
def test_the_scenario_burners_inside_a_one_core_class_take_half_of_it_not_all() -> None:
    """Sized to the class's one core: one burner busy half the time, in the class's cgroup and paced with it
    (sized to the host's two CPUs, one burner ran flat out and took the class's whole budget)."""
    rpi = dc.CLASSES["rpi4-class"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = dc.run_in_class(rpi, [sys.executable, "-c", _BURN_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, timeout_s=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    got = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert got["processes"] == 1 and got["duties"] == [0.5] and got["same_cgroup"]
    # Half of the class's budget, with room for the pacer's overshoot and a shared machine's shortfall.
    assert 0.25 * rpi.cpu_budget <= got["cpu_s_per_s"] <= 0.8 * rpi.cpu_budget, got


def test_class_measured_counts_a_repetition_as_held_only_on_exact_clocks_and_its_budget() -> None:
    from benchmarks.device import class_measured

    budget = class_measured.CLASSES["rpi4-class"].cpu_budget
    assert class_measured._pacer_held("rpi4-class", {"exact_cpu_clock": True, "delivered_cpu_s_per_s": budget})
    # The failure it flags: a pacer on tick-stale clocks let the class run late, then owe (0.21 of 0.25).
    assert not class_measured._pacer_held("rpi4-class", {"exact_cpu_clock": True,
                                                         "delivered_cpu_s_per_s": 0.84 * budget})
    assert not class_measured._pacer_held("rpi4-class", {"exact_cpu_clock": False, "delivered_cpu_s_per_s": budget})
    assert not class_measured._pacer_held("rpi4-class", {"pacer_error": "pacer exited 1"})


_SAMPLER_PROBE = """
import json, subprocess, sys, time
from hmt.serve.deciding.monitor import PsutilSampler
burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if sys.argv[1] == "inside" else None
try:
    time.sleep(0.3)
    sampler = PsutilSampler(use_nvml=False)
    time.sleep(1.5)
    s = sampler()
finally:
    if burner is not None:
        burner.kill()
        burner.wait()
print(json.dumps({"cpu_util": s.cpu_util, "own": s.own_cpu_util, "source": sampler.cpu_source}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not _cgroups_writable(), reason="needs root and writable cpu/cpuset cgroups")
def test_the_sampler_inside_a_quota_reads_the_cgroups_own_load_not_its_cores() -> None:
    """Inside a one-core class held to 25 % by a CFS quota, a busy loop in the class spends the quota (the
    core reads about a quarter busy, so the busy share never rose): the sampler reads it full. A busy loop
    outside the class on the same core keeps the core busy but not the class: the sampler reads it idle."""
    rpi = replace(dc.CLASSES["rpi4-class"], mechanism="cfs")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def probe(where: str) -> dict[str, Any]:
        done = dc.run_in_class(rpi, [sys.executable, "-c", _SAMPLER_PROBE, where], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, timeout_s=60)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        return dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))

    inside = probe("inside")
    assert inside["source"].startswith("cgroup CPU time over its quota of 0.25 cores") and inside["cpu_util"] >= 0.8
    outside_burner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                      preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    try:
        outside = probe("outside")
    finally:
        outside_burner.kill()
        outside_burner.wait()
    assert outside["cpu_util"] <= 0.3, (inside, outside)


_SPAWN_AND_WAIT = """
import subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy child the pacer keeps stopping
print(kid.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not _cgroups_writable(), reason="needs root and writable cpu/cpuset cgroups")
def test_a_class_killed_with_sigterm_leaves_no_process_and_no_cgroup() -> None:
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.device.device_class", "rpi4-class", "--", sys.executable,
                             "-c", _SPAWN_AND_WAIT], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.stdout is not None
    kid = int(proc.stdout.readline())
    where = dc.layout()
    groups = sorted({g for d in (where.cpu, where.cpuset) for g in d.glob(f"hmt-rpi4-class-{proc.pid}-*")})
    assert groups and Path(f"/proc/{kid}").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not any(g.exists() for g in groups)
    assert _gone(kid)  # killed, not left stopped in a removed class


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """The process has exited: no /proc entry, or a zombie its new parent has yet to reap."""
    import time

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_a_child_error_keeps_the_traceback_not_only_the_warnings_after_it() -> None:
    """A serve scenario that failed inside a class printed its traceback, then the resource tracker's
    shutdown warning; keeping only the end of stderr kept the warning and lost the cause."""
    from benchmarks.device.device_class import child_error

    stderr = "starting\nTraceback (most recent call last):\n  File \"x\"\nValueError: the cause\n" + "warn\n" * 600
    kept = child_error(stderr, limit=200)
    assert kept.startswith("Traceback") and "ValueError: the cause" in kept and len(kept) <= 200
    assert child_error("no traceback here\n" * 400, limit=50) == ("no traceback here\n" * 400)[-50:]
