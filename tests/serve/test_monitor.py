"""Resource monitor with an injected sampler; the live psutil sampler once."""

from __future__ import annotations

import itertools
import threading

import pytest

from hmt.errors import DeviceError, UsageError
from hmt.runtime.cpus import CpuCapacity
from hmt.serve import PsutilSampler, ResourceMonitor, ResourceSample


def fake_sampler():
    counter = itertools.count()

    def sample() -> ResourceSample:
        i = next(counter)
        return ResourceSample(
            time_s=float(i), cpu_util=(i % 10) / 10, mem_available_bytes=500, mem_total_bytes=1000, battery_percent=80.0
        )

    return sample


def test_sample_now_records() -> None:
    mon = ResourceMonitor(sampler=fake_sampler(), history_len=3)
    assert mon.latest is None
    for _ in range(5):
        mon.sample_now()
    assert [s.time_s for s in mon.history()] == [2.0, 3.0, 4.0]
    assert mon.latest is not None and mon.latest.time_s == 4.0


def test_thread_start_stop() -> None:
    got = threading.Event()
    seen: list[ResourceSample] = []

    def on_sample(s: ResourceSample) -> None:
        seen.append(s)
        if len(seen) >= 3:
            got.set()

    mon = ResourceMonitor(sampler=fake_sampler(), frequency_hz=100.0, on_sample=on_sample)
    mon.start()
    assert mon.running
    with pytest.raises(UsageError):
        mon.start()
    assert got.wait(5.0)
    mon.stop()
    assert not mon.running
    count = len(mon.history())
    assert count >= 3
    mon.stop()  # idempotent
    assert len(mon.history()) == count


def test_failing_sampler() -> None:
    calls = itertools.count()
    done = threading.Event()

    def bad() -> ResourceSample:
        if next(calls) >= 2:
            done.set()
        raise OSError("sensor gone")

    mon = ResourceMonitor(sampler=bad, frequency_hz=200.0)
    with pytest.raises(DeviceError, match="sensor gone"):
        mon.sample_now()
    with mon:
        assert done.wait(5.0)
    assert mon.error_count >= 2 and isinstance(mon.last_error, OSError)


def test_bad_arguments() -> None:
    with pytest.raises(UsageError):
        ResourceMonitor(sampler=fake_sampler(), frequency_hz=0.0)


def test_live_sampler_reads_this_machine() -> None:
    sampler = PsutilSampler(use_nvml=False)
    s = sampler()
    sampler.close()
    assert 0.0 <= s.cpu_util <= 1.0
    assert 0 < s.mem_available_bytes <= s.mem_total_bytes
    assert 0.0 <= s.mem_util <= 1.0
    assert s.gpu_util is None
    assert s.battery_percent is None or 0.0 <= s.battery_percent <= 100.0


def test_sampler_pinned_to_some_cores_reads_those_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # A container or an emulated device class pinned to core 0 of 2: core 0 at 80 %, core 1 idle.
    # The machine's average (40 %) would read half the load the pinned process competes with.
    import psutil

    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)

    def fake_percent(interval: float | None = None, percpu: bool = False) -> float | list[float]:
        return [80.0, 0.0] if percpu else 40.0

    monkeypatch.setattr(psutil, "cpu_percent", fake_percent)
    pinned = PsutilSampler(use_nvml=False, cpus={0})
    assert pinned().cpu_util == pytest.approx(0.8)
    everywhere = PsutilSampler(use_nvml=False, cpus={0, 1})
    assert everywhere().cpu_util == pytest.approx(0.4)


class _Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class _Times:
    def __init__(self, cpu_s: float) -> None:
        self.user, self.system = cpu_s, 0.0


def _quota_sampler(monkeypatch: pytest.MonkeyPatch, capacity: CpuCapacity, group: list[float | Exception | None],
                   own: list[float]) -> tuple[PsutilSampler, _Clock]:
    """A sampler pinned to core 0 of 2 (psutil reads it 30 % busy) with a fake clock, its own CPU time
    (``own[0]``) and the quota cgroup's (``group[0]``; an exception is raised) as the test sets them."""
    import psutil

    class Process:
        def cpu_times(self) -> _Times:
            return _Times(own[0])

    def reader() -> float | None:
        value = group[0]
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr(psutil, "Process", Process)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 2)
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None, percpu=False: [30.0, 0.0] if percpu else 15.0)
    clock = _Clock()
    return PsutilSampler(use_nvml=False, clock=clock, cpus={0}, capacity=capacity, cgroup_cpu=reader,
                         own_cpu_s=lambda: Process().cpu_times().user), clock


def test_inside_a_quota_the_cpu_is_the_cgroups_time_over_the_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    # A quarter core on core 0: the cgroup spent its whole quota (0.25 s in 1 s), serve 0.05 s of it, and
    # the core reads only 30 % busy (throttled the rest of the time).
    group: list[float | Exception | None] = [10.0]
    own = [3.0]
    sampler, clock = _quota_sampler(monkeypatch, CpuCapacity(cpus=1, quota_cores=0.25), group, own)
    clock.now_s, group[0], own[0] = 101.0, 10.25, 3.05
    s = sampler()
    assert s.cpu_util == pytest.approx(1.0) and s.own_cpu_util == pytest.approx(0.2)
    assert sampler.cpu_source.startswith("cgroup CPU time over its quota of 0.25 cores")
    clock.now_s, group[0], own[0] = 103.0, 10.35, 3.10  # 0.1 s in 2 s: a fifth of the quota, serve a tenth
    s = sampler()
    assert s.cpu_util == pytest.approx(0.2) and s.own_cpu_util == pytest.approx(0.1)


def test_a_failed_cgroup_reading_falls_back_to_the_cores_busy_share(monkeypatch: pytest.MonkeyPatch) -> None:
    group: list[float | Exception | None] = [10.0]
    own = [3.0]
    sampler, clock = _quota_sampler(monkeypatch, CpuCapacity(cpus=1, quota_cores=0.25), group, own)
    for value in (None, OSError("gone")):
        clock.now_s, group[0], own[0] = clock.now_s + 1.0, value, own[0] + 0.1
        s = sampler()  # never raises
        assert s.cpu_util == pytest.approx(0.3) and s.own_cpu_util == pytest.approx(0.1)  # on core 0's base
        assert sampler.cpu_source == "busy share of core(s) 0 (psutil)"
    clock.now_s, group[0] = clock.now_s + 2.0, 10.4  # the next reading covers the time since the last good one
    assert sampler().cpu_util == pytest.approx(0.4)


@pytest.mark.parametrize("capacity", [CpuCapacity(cpus=1), CpuCapacity(cpus=1, quota_cores=1.0),
                                      CpuCapacity(cpus=2, quota_cores=4.0)])
def test_without_a_quota_below_the_cores_the_cgroup_is_not_read(monkeypatch: pytest.MonkeyPatch,
                                                                 capacity: CpuCapacity) -> None:
    group: list[float | Exception | None] = [10.0]
    own = [3.0]
    sampler, clock = _quota_sampler(monkeypatch, capacity, group, own)
    clock.now_s, group[0], own[0] = 101.0, 20.0, 3.5  # read, the cgroup would say 1.0
    s = sampler()
    assert (s.cpu_util, s.own_cpu_util) == (pytest.approx(0.3), pytest.approx(0.5))
    assert sampler.cpu_source.startswith("busy share")
