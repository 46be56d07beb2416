"""The scenario's busy processes are sized to the CPU capacity serve has (hmt.serve.running.burn): one per
core without a limit, as before; one for a one-core device class; the busy time scaled to a fractional
quota."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from hmt.errors import UsageError
from hmt.runtime.cpus import CpuCapacity, cpu_capacity
from hmt.serve.running import burn
from hmt.serve.running.burn import LoadGenerator


@pytest.mark.parametrize(("cores", "cpu_load", "processes", "duties"), [
    (2.0, 0.5, 2, [1.0, 0.0]),  # the host without a limit: as before, one per core
    (2.0, 1.0, 2, [1.0, 1.0]),
    (1.0, 0.5, 1, [0.5]),  # rpi4-class: one core, half of it
    (1.0, 1.0, 1, [1.0]),
    (0.25, 0.5, 1, [0.125]),  # a kernel quota of a quarter core: half of that CPU time
    (1.5, 1.0, 2, [1.0, 0.5]),
    (2.0, None, 2, [0.0, 0.0]),
])
def test_burners_follow_the_capacity(cores: float, cpu_load: float | None, processes: int,
                                     duties: list[float]) -> None:
    gen = LoadGenerator(cores=cores)  # not started: no process runs
    assert gen.processes == processes and gen.cores == cores
    gen.set(cpu_load)
    assert gen.duties == pytest.approx(duties)
    assert gen.load == pytest.approx(cpu_load or 0.0)


@pytest.mark.parametrize("cores", [0.0, -1.0, float("nan"), float("inf")])
def test_a_capacity_that_is_no_capacity_is_refused(cores: float) -> None:
    with pytest.raises(UsageError, match="CPU capacity must be > 0 cores"):
        LoadGenerator(cores=cores)


def test_the_default_is_the_detected_capacity_of_the_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-core class (cgroup v1 cpuset 0, no kernel quota: the pacer keeps its budget) gets one burner;
    the same process outside it (no limit, two cores) gets two, as before."""
    cg, group = tmp_path / "cg", "hmt-rpi4-class-1"
    files = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n", "cpuset/cpuset.cpus": "0-1\n",
             f"cpu/{group}/cpu.cfs_quota_us": "-1\n", f"cpu/{group}/cpu.cfs_period_us": "4000\n",
             f"cpuset/{group}/cpuset.cpus": "0\n"}
    for rel, text in files.items():
        (cg / rel).parent.mkdir(parents=True, exist_ok=True)
        (cg / rel).write_text(text)
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.write_text("3:cpuset:/hmt-rpi4-class-1\n1:cpu:/hmt-rpi4-class-1\n0::/\n")
    outside.write_text("3:cpuset:/\n1:cpu:/\n0::/\n")
    for where, processes in ((inside, 1), (outside, 2)):
        monkeypatch.setattr(burn, "cpu_capacity", functools.partial(cpu_capacity, cg, where, affinity={0, 1}))
        gen = LoadGenerator()
        assert gen.processes == processes and gen.capacity is not None
        gen.set(0.5)
        assert gen.duties == ([0.5] if processes == 1 else [1.0, 0.0])
        assert gen.describe()["processes"] == processes


def test_the_summary_says_what_the_burners_were_sized_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(burn, "cpu_capacity", lambda: CpuCapacity(cpus=1, quota_cores=0.25, source="test",
                                                                  notes=("cpu.max: odd; skipped",)))
    doc = LoadGenerator().describe()
    assert doc == {"cores": 0.25, "processes": 1, "capacity": "0.25 cores of CPU (1 core(s), quota 0.25 cores; "
                   "from test)", "capacity_notes": ["cpu.max: odd; skipped"]}


def test_start_returns_once_the_burners_are_up() -> None:
    """Spawning a burner is a new interpreter and its imports (a fraction of a core-second each): start()
    waits for it, so at duty 0 the burners use next to no CPU from the moment it returns, and the
    replay's first second is not loaded by their start-up."""
    import time

    import psutil

    gen = LoadGenerator(cores=2.0)
    gen.set(0.0)
    gen.start()
    try:
        procs = [psutil.Process(p.pid) for p in gen._procs if p.pid is not None]
        assert len(procs) == 2 and all(e.is_set() for e in gen._ready)
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(0.5)
        after = [sum(p.cpu_times()[:2]) for p in procs]
        assert max(b - a for a, b in zip(before, after, strict=True)) < 0.1  # CPU seconds in 0.5 s of duty 0
    finally:
        gen.stop()


def test_stop_after_a_start_that_never_started_the_burners_is_safe() -> None:
    """A start that raised before every burner started (a spawn that failed, a timeout) leaves burners
    never started: stop() skips them instead of raising "can only join a started process" over the
    error that start raised."""
    gen = LoadGenerator(cores=2.0)
    gen.stop()  # none started
    assert all(p.pid is None for p in gen._procs)
