"""The CPU capacity a process may use (hmt.runtime.cpus), read from fake cgroup files (v1 and v2), and
what an unreadable or odd file falls back to."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.runtime.cpus import CpuCapacity, cpu_capacity, parse_cpu_list

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
