"""The CPU capacity a process may use (hmt.runtime.cpus), read from fake cgroup files (v1 and v2), and
what an unreadable or odd file falls back to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hmt.runtime.cpus import CgroupCpuTime, CpuCapacity, cpu_capacity, parse_cpu_list, parse_task_stat

FOUR = {0, 1, 2, 3}


def _files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _v2(tmp_path: Path, group: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = _files(tmp_path / "cg", {"cgroup.controllers": "cpuset cpu io memory pids\n", **files})
    return root, _files(tmp_path, {"self_cgroup": f"0::{group}\n"}) / "self_cgroup"


def _v1(tmp_path: Path, group: str, files: dict[str, str], cpu_dir: str = "cpu") -> tuple[Path, Path]:
    root = _files(tmp_path / "cg", {f"{cpu_dir}/cpu.cfs_quota_us": "-1\n", f"{cpu_dir}/cpu.cfs_period_us": "100000\n",
                                    "cpuset/cpuset.cpus": "0-3\n", **files})
    lines = f"12:pids:/\n4:memory:/user\n3:cpuset:{group}\n1:{cpu_dir}:{group}\n0::/\n"
    return root, _files(tmp_path, {"self_cgroup": lines}) / "self_cgroup"


@pytest.mark.parametrize(("text", "cores"), [
    ("0", {0}), ("0-1,3", {0, 1, 3}), ("0-1,3\n", {0, 1, 3}), (" 2 , 4-5 ", {2, 4, 5}), ("", set()), ("\n", set()),
])
def test_cpu_lists(text: str, cores: set[int]) -> None:
    assert parse_cpu_list(text) == cores


@pytest.mark.parametrize("text", ["a", "1-0", "0-", "-1", "0-1-2", "3,x", "0-99999999"])
def test_odd_cpu_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_no_cgroup_files_is_the_affinity(tmp_path: Path) -> None:
    got = cpu_capacity(tmp_path / "none", tmp_path / "none" / "cgroup", affinity={0, 1})
    assert got.cores == 2.0 and got.quota_cores is None and got.cpus == 2
    assert got.notes == (tmp_path.joinpath("none", "cgroup").as_posix() + ": cannot read (No such file or "
                         "directory); the cgroup's top folders only",)


def test_v2_quota_and_cpuset_of_the_process_group(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/hmt-rpi4-class-1", {
        "hmt-rpi4-class-1/cpu.max": "25000 100000\n", "hmt-rpi4-class-1/cpuset.cpus.effective": "0\n",
        "other/cpu.max": "1000 100000\n"})  # a sibling's limit is not ours
    got = cpu_capacity(root, self_cgroup, affinity=FOUR)
    assert (got.cpus, got.quota_cores, got.cores, got.notes) == (1, 0.25, 0.25, ())
    assert "cpuset 0" in got.source and "cpu.max 0.25 cores" in got.source


def test_v2_max_is_no_quota_and_the_smallest_ancestor_quota_wins(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/a/b", {"a/b/cpu.max": "max 100000\n", "a/cpu.max": "150000 100000\n",
                                                "a/b/cpuset.cpus.effective": "0-3\n"})
    got = cpu_capacity(root, self_cgroup, affinity=FOUR)
    assert (got.cpus, got.quota_cores, got.cores) == (4, 1.5, 1.5)
    root, self_cgroup = _v2(tmp_path / "unlimited", "/a", {"a/cpu.max": "max 100000\n"})
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert (got.quota_cores, got.cores) == (None, 2.0)


def test_v1_quota_and_cpuset(tmp_path: Path) -> None:
    root, self_cgroup = _v1(tmp_path, "/hmt-nano-class-7", {
        "cpu/hmt-nano-class-7/cpu.cfs_quota_us": "80000\n", "cpu/hmt-nano-class-7/cpu.cfs_period_us": "100000\n",
        "cpuset/hmt-nano-class-7/cpuset.cpus": "0-1,3\n"})
    got = cpu_capacity(root, self_cgroup, affinity=FOUR)
    assert (got.cpus, got.quota_cores, got.cores, got.notes) == (3, 0.8, 0.8, ())


def test_v1_minus_one_is_no_quota_and_combined_controller_mounts_are_found(tmp_path: Path) -> None:
    root, self_cgroup = _v1(tmp_path, "/g", {"cpu,cpuacct/g/cpu.cfs_quota_us": "-1\n",
                                             "cpu,cpuacct/g/cpu.cfs_period_us": "100000\n"}, cpu_dir="cpu,cpuacct")
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert (got.cpus, got.quota_cores, got.cores, got.notes) == (2, None, 2.0, ())
    (root / "cpu,cpuacct/cpu.cfs_quota_us").write_text("50000\n")  # the parent's limit holds for the child
    assert cpu_capacity(root, self_cgroup, affinity={0, 1}).cores == 0.5


def test_a_group_missing_under_the_mount_reads_the_mount_itself(tmp_path: Path) -> None:
    """A container sees its own cgroup at the mount while /proc/self/cgroup names the host's path."""
    root, self_cgroup = _v2(tmp_path, "/docker/abc", {"cpu.max": "50000 100000\n"})
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert got.cores == 0.5 and got.notes == ()


@pytest.mark.parametrize("text", ["garbage\n", "25000\n", "0 100000\n", "-5 100000\n", "25000 0\n", "abc 100000\n",
                                  "1 2 3\n"])
def test_an_odd_cpu_max_is_skipped_and_said(tmp_path: Path, text: str) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpu.max": text, "cpu.max": "150000 100000\n"})
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert got.quota_cores == 1.5  # the parent's, which reads fine
    assert len(got.notes) == 1 and "cpu.max" in got.notes[0] and repr(text.strip()) in got.notes[0]
    assert "skipped" in got.notes[0]


@pytest.mark.parametrize(("quota", "period"), [("lots", "100000"), ("0", "100000"), ("50000", "-1"), ("", "")])
def test_an_odd_v1_quota_is_skipped_and_said(tmp_path: Path, quota: str, period: str) -> None:
    root, self_cgroup = _v1(tmp_path, "/g", {"cpu/g/cpu.cfs_quota_us": quota, "cpu/g/cpu.cfs_period_us": period})
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert got.cores == 2.0 and len(got.notes) == 1 and "cpu.cfs_quota_us" in got.notes[0]


def test_unreadable_files_and_odd_cpusets_fall_back_to_the_affinity(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpuset.cpus.effective": "0-x\n"})
    (root / "g" / "cpu.max").mkdir()  # reading it fails (IsADirectoryError), as an unreadable file does
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert (got.cpus, got.quota_cores) == (2, None)
    assert any("cpu.max: cannot read" in n for n in got.notes)
    assert any("cpuset.cpus.effective: '0-x' is not a CPU list" in n for n in got.notes)


def test_a_cpuset_sharing_no_core_with_the_affinity_is_skipped(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpuset.cpus.effective": "6-7\n"})
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert got.cpus == 2 and "shares no core with the affinity [0, 1]" in got.notes[0]


def test_a_group_path_leaving_the_mount_reads_the_mount_only(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/../outside", {"cpu.max": "max 100000\n"})
    _files(tmp_path, {"outside/cpu.max": "10000 100000\n"})
    assert cpu_capacity(root, self_cgroup, affinity={0, 1}).cores == 2.0


def test_odd_lines_of_the_process_cgroup_file_are_said(tmp_path: Path) -> None:
    root = _files(tmp_path / "cg", {"cgroup.controllers": "cpu\n", "cpu.max": "100000 100000\n"})
    self_cgroup = _files(tmp_path, {"self_cgroup": "nonsense\n0::/\n"}) / "self_cgroup"
    got = cpu_capacity(root, self_cgroup, affinity={0, 1})
    assert got.cores == 1.0 and got.notes == (f"{self_cgroup}: skipped the line 'nonsense' (expected "
                                              "ID:CONTROLLERS:/PATH)",)


def test_this_process_has_some_capacity() -> None:
    got = cpu_capacity()
    assert 0 < got.cores <= got.cpus and isinstance(got, CpuCapacity) and got.describe().startswith(f"{got.cores:g}")


# -- the quota cgroup's CPU time (CgroupCpuTime) ----------------------------------------------------


def _stat(task: int, start_ticks: int, used_ticks: int, comm: str = "python3") -> str:
    """A /proc/PID/stat line: utime (field 14) holds all but one tick of the time, stime (15) one."""
    return (f"{task} ({comm}) S 1 1 1 0 -1 0 0 0 0 0 {used_ticks - 1} 1 0 0 20 0 1 0 {start_ticks} "
            "1000 100 18446744073709551615\n")


def _proc(proc: Path, uptime_s: float, tasks: dict[int, tuple[int, int]], per_thread: bool) -> None:
    """A fake /proc: its uptime and a stat file per task; tasks not named are gone."""
    if proc.exists():
        for stat in proc.rglob("stat"):
            stat.unlink()
    files = {"uptime": f"{uptime_s:.2f} 0.00\n"}
    for task, (start, used) in tasks.items():
        files[f"{task}/task/{task}/stat" if per_thread else f"{task}/stat"] = _stat(task, start, used)
    _files(proc, files)


def test_v2_usage_is_the_binding_quota_groups_cpu_stat(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/a/b", {
        "a/cpu.max": "25000 100000\n", "a/cpu.stat": "usage_usec 1500000\nuser_usec 1000000\n",
        "a/b/cpu.max": "50000 100000\n", "a/b/cpu.stat": "usage_usec 7\n"})  # a's quota binds: its time is read
    reader = CgroupCpuTime(root, self_cgroup, proc_root=tmp_path / "no-proc")
    assert (reader.quota_cores, reader.quota_group, reader()) == (0.25, root / "a", 1.5)
    (root / "a" / "cpu.stat").write_text("user_usec 1\nusage_usec 2250000\n")
    assert reader() == 2.25 and reader.source == str(root / "a" / "cpu.stat") and reader.notes == []


def test_no_quota_reads_nothing(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpu.max": "max 100000\n", "g/cpu.stat": "usage_usec 5\n"})
    reader = CgroupCpuTime(root, self_cgroup)
    assert reader() is None and reader.quota_cores is None and reader.source.startswith("none")


def test_v1_cpuacct_mounted_with_cpu_is_read_in_seconds(tmp_path: Path) -> None:
    root, self_cgroup = _v1(tmp_path, "/g", {"cpu,cpuacct/g/cpu.cfs_quota_us": "50000\n",
                                             "cpu,cpuacct/g/cpu.cfs_period_us": "100000\n",
                                             "cpu,cpuacct/g/cpuacct.usage": "2500000000\n"}, cpu_dir="cpu,cpuacct")
    reader = CgroupCpuTime(root, self_cgroup)
    assert (reader.quota_cores, reader()) == (0.5, 2.5) and reader.source.endswith("cpuacct.usage")


def test_v1_cpuacct_at_the_same_path_in_its_own_hierarchy_is_read(tmp_path: Path) -> None:
    root, self_cgroup = _v1(tmp_path, "/g", {"cpu/g/cpu.cfs_quota_us": "25000\n", "cpu/g/cpu.cfs_period_us": "100000\n",
                                             "cpuacct/g/cpuacct.usage": "1000000000\n"})
    self_cgroup.write_text(self_cgroup.read_text() + "2:cpuacct:/g\n")
    assert CgroupCpuTime(root, self_cgroup)() == 1.0


def test_v1_tasks_sum_per_thread_deltas_through_exits_new_tasks_and_reused_ids(tmp_path: Path) -> None:
    """cpuacct is a hierarchy of its own where this process sits at the root (as on a host whose class
    cgroups exist in cpu and cpuset only): its usage would count the whole machine, so the class's
    tasks are summed from /proc instead, in the quota's cgroup and the one below it."""
    root, self_cgroup = _v1(tmp_path, "/class", {
        "cpu/class/cpu.cfs_quota_us": "25000\n", "cpu/class/cpu.cfs_period_us": "100000\n",
        "cpu/class/tasks": "10\n11\n", "cpu/class/sub/tasks": "", "cpuacct/cpuacct.usage": "999999999999\n"})
    self_cgroup.write_text(self_cgroup.read_text() + "2:cpuacct:/\n")
    proc = tmp_path / "proc"
    _proc(proc, 1000.0, {10: (500, 300), 11: (600, 50)}, per_thread=True)
    reader = CgroupCpuTime(root, self_cgroup, proc_root=proc, ticks_per_s=100)
    assert reader.source == f"{root / 'cpu' / 'class' / 'tasks'} (CPU time of each task)"
    assert any("cpuacct cgroup / is not its cpu cgroup /class" in n for n in reader.notes)
    assert reader() == 0.0  # the first reading: what the tasks used before it is not counted
    # 11 exited; 12 started after the first reading (all its time counts); 13 was moved in (none counts).
    (root / "cpu/class/tasks").write_text("10\n11\n13\n")
    (root / "cpu/class/sub/tasks").write_text("12\n")
    _proc(proc, 1001.0, {10: (500, 325), 12: (100_050, 10), 13: (700, 999)}, per_thread=True)
    assert reader() == pytest.approx(0.35)  # 25 + 10 ticks
    # 10 exited and its id went to a new task; 12 and 13 ran on.
    _proc(proc, 1002.0, {10: (100_150, 5), 12: (100_050, 30), 13: (700, 1009)}, per_thread=True)
    assert reader() == pytest.approx(0.70)  # + 5 + 20 + 10 ticks


def test_v2_without_usage_sums_the_processes_of_cgroup_procs(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpu.max": "50000 100000\n", "g/cpu.stat": "nr_periods 3\n",
                                             "g/cgroup.procs": "7\n"})
    proc = tmp_path / "proc"
    _proc(proc, 50.0, {7: (100, 40)}, per_thread=False)
    reader = CgroupCpuTime(root, self_cgroup, proc_root=proc, ticks_per_s=100)
    assert reader() == 0.0 and "cgroup.procs" in reader.source
    _proc(proc, 51.0, {7: (100, 90)}, per_thread=False)
    assert reader() == pytest.approx(0.5)


def test_too_many_tasks_or_unreadable_files_read_none_and_say_so(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpu.max": "50000 100000\n", "g/cgroup.procs": "1\n2\n3\n"})
    proc = tmp_path / "proc"
    _proc(proc, 5.0, {1: (1, 1), 2: (1, 1), 3: (1, 1)}, per_thread=False)
    reader = CgroupCpuTime(root, self_cgroup, proc_root=proc, max_tasks=2)
    assert reader() is None and reader() is None
    assert [n for n in reader.notes if "more than 2 tasks" in n] == [f"{root / 'g'}: more than 2 tasks; their CPU "
                                                                    "time is not summed"]  # said once
    (proc / "uptime").write_text("garbage\n")
    assert CgroupCpuTime(root, self_cgroup, proc_root=proc)() is None
    (root / "g" / "cgroup.procs").write_text("1\nnot-a-pid\n")
    assert CgroupCpuTime(root, self_cgroup, proc_root=proc)() is None


def test_task_stat_lines_with_odd_command_names() -> None:
    assert parse_task_stat(_stat(5, 1234, 77, comm="a) (b c")) == (1234, 77)
    with pytest.raises(ValueError):
        parse_task_stat("5 (short) S 1 2 3\n")
    start, used = parse_task_stat(Path("/proc/self/stat").read_text())  # this process: started since boot
    assert used >= 0 and 0 < start / os.sysconf("SC_CLK_TCK") <= float(Path("/proc/uptime").read_text().split()[0])


def test_a_given_quota_reads_this_process_cgroup_where_no_kernel_file_holds_one(tmp_path: Path) -> None:
    """A paced class: its cpu cgroup has no quota (-1); the quota serve is told charges the class's tasks."""
    root, self_cgroup = _v1(tmp_path, "/class", {"cpu/class/cpu.cfs_quota_us": "-1\n",
                                                 "cpu/class/cpu.cfs_period_us": "100000\n", "cpu/class/tasks": "10\n"})
    proc = tmp_path / "proc"
    _proc(proc, 100.0, {10: (50, 100)}, per_thread=True)
    assert CgroupCpuTime(root, self_cgroup, proc_root=proc)() is None  # told nothing: no quota, nothing read
    reader = CgroupCpuTime(root, self_cgroup, proc_root=proc, ticks_per_s=100, quota_cores=0.25)
    assert (reader.quota_cores, reader.quota_group) == (0.25, root / "cpu" / "class") and reader() == 0.0
    _proc(proc, 101.0, {10: (50, 125)}, per_thread=True)
    assert reader() == pytest.approx(0.25)


def test_a_smaller_kernel_quota_binds_over_a_given_one(tmp_path: Path) -> None:
    root, self_cgroup = _v2(tmp_path, "/g", {"g/cpu.max": "10000 100000\n", "g/cpu.stat": "usage_usec 3000000\n"})
    reader = CgroupCpuTime(root, self_cgroup, quota_cores=0.5)
    assert (reader.quota_cores, reader()) == (0.1, 3.0)
    assert CgroupCpuTime(root, self_cgroup, quota_cores=0.05).quota_cores == 0.05
    with pytest.raises(ValueError):
        CgroupCpuTime(root, self_cgroup, quota_cores=0.0)


def test_a_threads_schedstat_gives_its_time_in_ns_where_it_is_readable(tmp_path: Path) -> None:
    """The 10 ms ticks of utime + stime are six to a reading of a quarter core every 0.25 s; a thread's
    schedstat counts ns. A process's schedstat is its leader thread's alone, so cgroup.procs reads ticks."""
    root, self_cgroup = _v1(tmp_path, "/class", {"cpu/class/cpu.cfs_quota_us": "25000\n",
                                                 "cpu/class/cpu.cfs_period_us": "100000\n", "cpu/class/tasks": "10\n"})
    proc = tmp_path / "proc"
    _proc(proc, 100.0, {10: (50, 100)}, per_thread=True)
    (proc / "10/task/10/schedstat").write_text("1000123456 500 7\n")
    reader = CgroupCpuTime(root, self_cgroup, proc_root=proc, ticks_per_s=100)
    assert reader() == 0.0
    (proc / "10/task/10/schedstat").write_text("1003456789 500 9\n")
    assert reader() == pytest.approx(0.003333333, abs=1e-9)  # not a whole tick
