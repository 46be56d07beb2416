"""Resource monitor with an injected sampler; the live psutil sampler once."""

from __future__ import annotations

import itertools
import threading

import pytest

from hmt.errors import DeviceError, UsageError
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
