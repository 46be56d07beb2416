"""Emulated device classes (benchmarks/device/device_class.py): the cgroup files a class writes, on a
fake hierarchy, and, where this machine lets root write cgroups, the CPU budget a process really gets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert (rpi.cpus, rpi.quota_us, rpi.period_us, rpi.cpu_budget) == ((0,), 1_000, 4_000, 0.25)
    assert (nano.cpus, nano.quota_us, nano.period_us, nano.cpu_budget) == ((0, 1), 3_200, 4_000, 0.8)


def test_a_v1_class_writes_quota_cores_and_weight_and_removes_its_groups(tmp_path: Path) -> None:
    root = _v1(tmp_path / "cg")
    nano = dc.CLASSES["nano-class"]
    with dc.class_cgroup(nano, root=root) as procs:
        name = f"hmt-nano-class-{os.getpid()}"
        cpu, cpuset = root / "cpu" / name, root / "cpuset" / name
        assert procs == [cpu / "cgroup.procs", cpuset / "cgroup.procs"]
        assert (cpu / "cpu.cfs_quota_us").read_text() == "3200"
        assert (cpu / "cpu.cfs_period_us").read_text() == "4000"
        assert (cpu / "cpu.shares").read_text() == str(dc.CLASS_WEIGHT_V1)
        assert (cpuset / "cpuset.cpus").read_text() == "0,1" and (cpuset / "cpuset.mems").read_text() == "0"
        for group in (cpu, cpuset):  # a real cgroup's files vanish with it; the fake's must go first
            for f in group.iterdir():
                f.unlink()
    assert not cpu.exists() and not cpuset.exists()


def test_a_v2_class_writes_cpu_max(tmp_path: Path) -> None:
    root = tmp_path / "cg2"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    with dc.class_cgroup(dc.CLASSES["rpi4-class"], root=root) as procs:
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
        assert 0.65 * budget <= share <= budget + 0.05, (name, share)  # short periods deliver a little less
    done = subprocess.run([sys.executable, "-m", "benchmarks.device.device_class", "rpi4-class", "--", sys.executable,
                           "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0 and done.stdout.strip() == "[0]"
