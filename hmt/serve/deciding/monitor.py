"""Resource monitor: CPU, memory, GPU, battery and temperature, sampled on a thread and on demand.

The sampler is any callable returning a :class:`ResourceSample`; :class:`PsutilSampler`
reads the live machine (psutil, plus NVML through ``pynvml`` when it is importable and a
GPU answers). Tests and scenario replay pass their own sampler instead.

CPU utilisation is psutil's ``cpu_percent(interval=None)``: the busy share of the cores
since the previous call (the /proc/stat difference of AdaScale IV-A), so the sampler
never blocks. The first reading after construction covers the time since construction.
"The cores" are those this process may run on (its affinity, which a cgroup cpuset narrows:
a container or an emulated device class pinned to one core of two reads that core, not the
machine's average, which the other core's idleness would halve); serve's own share is over
the same cores, so the outside load is their difference on one base.

Inside a cgroup whose CPU quota is less than those cores (a container with ``--cpus``, a device
class at 25 % of one core) the cores' busy share is blind: when other processes of the cgroup have
spent the quota, the cgroup is throttled while its core reads a quarter busy, and that core also
runs work outside the cgroup. There ``cpu_util`` is the cgroup's own CPU time since the previous
sample over the quota's (:class:`hmt.runtime.cpus.CgroupCpuTime`: wall time x quota cores), and
``own_cpu_util`` is this process's CPU time on the same base, so their difference is the load of
the cgroup's other processes. A reading of the cgroup that fails falls back, for that sample, to
the cores' busy share (``cpu_source`` says which figure the last sample holds).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Callable, Collection

import psutil

from hmt.errors import DeviceError, UsageError
from hmt.runtime.cpus import CgroupCpuTime, CpuCapacity, allowed_cpus, cpu_capacity
from hmt.runtime.gpus import nvml_handle

Sampler = Callable[[], "ResourceSample"]


@dataclass(frozen=True)
class ResourceSample:
    """One reading of the device's resources. ``None`` means the device does not expose it."""

    time_s: float  # monotonic clock of the sampler
    cpu_util: float  # 0..1, all cores together
    mem_available_bytes: int
    mem_total_bytes: int
    cpu_freq_mhz: float | None = None
    gpu_util: float | None = None  # 0..1
    battery_percent: float | None = None  # 0..100
    battery_plugged: bool | None = None
    temperature_c: float | None = None  # hottest sensor
    # This process's share of all cores since the previous sample (0..1): serve's own
    # inference, which the load index must not count as outside load. None: not measured.
    own_cpu_util: float | None = None

    @property
    def mem_util(self) -> float:
        """Share of memory in use, 0..1 (1 - available / total)."""
        if self.mem_total_bytes <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.mem_available_bytes / self.mem_total_bytes))


class _Nvml:
    """GPU utilisation of device 0 through NVML; absent (``None``) when pynvml or a GPU is missing."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no NVML library, no driver or no GPU: GPU is absent
            return
        try:
            if pynvml.nvmlDeviceGetCount() > 0:
                self._handle = nvml_handle(pynvml, 0)[0]  # CUDA device 0 of this process
                self._nvml = pynvml
            else:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - a broken driver reads as no GPU
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()

    @property
    def present(self) -> bool:
        return self._nvml is not None

    def util(self) -> float | None:
        if self._nvml is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu) / 100.0
        except Exception:  # noqa: BLE001 - a GPU that stops answering is reported as absent
            return None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


class PsutilSampler:
    """Samples the live machine. ``use_nvml=False`` skips the GPU even where NVML exists.

    ``clock`` (monotonic seconds) stamps the samples and times the CPU shares. ``capacity`` (default:
    :func:`~hmt.runtime.cpus.cpu_capacity`) says whether a cgroup quota binds; ``cgroup_cpu`` gives the
    quota cgroup's cumulative CPU seconds (default: :class:`~hmt.runtime.cpus.CgroupCpuTime`), read
    only where the quota is less than the cores. ``own_cpu_s`` gives this process's CPU seconds (all its
    threads; default :func:`time.process_time`)."""

    def __init__(self, use_nvml: bool = True, clock: Callable[[], float] = time.monotonic,
                 cpus: Collection[int] | None = None, capacity: CpuCapacity | None = None,
                 cgroup_cpu: Callable[[], float | None] | None = None,
                 own_cpu_s: Callable[[], float] = time.process_time) -> None:
        self._own_cpu_s = own_cpu_s  # this process's CPU seconds, all threads (ns-exact, not in 10 ms ticks)
        self._clock = clock
        self._nvml = _Nvml() if use_nvml else None
        machine = psutil.cpu_count() or 1
        allowed = sorted(set(cpus) if cpus is not None else allowed_cpus())
        # Per-core readings only when this process is pinned to some of the cores (else the
        # machine-wide figure, the same thing, cheaper).
        self._cpus: list[int] | None = allowed if allowed and len(allowed) < machine else None
        self._cores = len(allowed) if self._cpus is not None else machine
        if capacity is None:
            capacity = cpu_capacity(affinity=cpus) if cpus is not None else cpu_capacity()
        self._capacity = capacity  # the kernel's view; use_cpu_quota adds a quota no kernel file holds
        self._set_quota(capacity, (lambda: cgroup_cpu) if cgroup_cpu is not None else CgroupCpuTime)
        self.prime()

    def use_cpu_quota(self, cores: float) -> None:
        """Read the load against ``cores`` cores' worth of CPU for this process's cgroup, a quota no
        kernel file holds (serve setting ``cpu_quota_cores``: a CPU paced from outside, a hypervisor's
        cap); a smaller kernel quota still binds."""
        kernel = self._capacity.quota_cores
        capacity = replace(self._capacity, quota_cores=cores if kernel is None else min(kernel, cores),
                           source=f"{self._capacity.source}; serve setting cpu_quota_cores {cores:g}")
        self._set_quota(capacity, lambda: CgroupCpuTime(quota_cores=cores))
        self.prime()

    def _set_quota(self, capacity: CpuCapacity, make_reader: Callable[[], Callable[[], float | None]]) -> None:
        """Read the cgroup's CPU time (``make_reader()``) where ``capacity``'s quota is less than its cores."""
        quota = capacity.quota_cores
        self._quota_cores: float | None = quota if quota is not None and quota < capacity.cpus else None
        self._cgroup_cpu: Callable[[], float | None] | None = None
        if self._quota_cores is not None:
            try:
                self._cgroup_cpu = make_reader()
            except Exception:  # noqa: BLE001 - it reads no odd file as an error; if it did, the busy share stands
                self._quota_cores = None
        where = f"core(s) {','.join(map(str, self._cpus))}" if self._cpus is not None else "all cores"
        self._busy_source = f"busy share of {where} (psutil)"
        self._quota_source = "" if self._quota_cores is None else (
            f"cgroup CPU time over its quota of {self._quota_cores:g} cores "
            f"({getattr(self._cgroup_cpu, 'source', 'given reader')})")
        self.cpu_source = self._quota_source or self._busy_source  # what the last sample's cpu_util is

    def prime(self) -> None:
        """The next sample measures from now (what ran before, such as a replay's load generator
        starting, is not in it)."""
        psutil.cpu_percent(interval=None, percpu=self._cpus is not None)
        self._own_last = self._own_times()
        self._group_last = self._group_times()

    def _own_times(self) -> tuple[float, float]:
        return self._clock(), float(self._own_cpu_s())

    def _group_times(self) -> tuple[float, float] | None:
        """(now, the quota cgroup's CPU seconds); None without a quota or when the reading fails."""
        if self._cgroup_cpu is None:
            return None
        try:
            used_s = self._cgroup_cpu()
        except Exception:  # noqa: BLE001 - a cgroup reading never stops the sampler: the busy share stands in
            used_s = None
        return None if used_s is None else (self._clock(), float(used_s))

    def _own_share(self, base_cores: float) -> float | None:
        """This process's CPU time since the last sample over the wall time of ``base_cores``."""
        try:
            now = self._own_times()
        except (OSError, psutil.Error):
            return None
        (t0, c0), (t1, c1) = self._own_last, now
        self._own_last = now
        if t1 - t0 <= 0:
            return None
        return min(1.0, max(0.0, (c1 - c0) / ((t1 - t0) * base_cores)))

    def _group_share(self) -> float | None:
        """The quota cgroup's CPU time since the last reading over the quota's; None: not measured."""
        if self._quota_cores is None:
            return None
        now, last = self._group_times(), self._group_last
        if now is not None:
            self._group_last = now
        if now is None or last is None or now[0] - last[0] <= 0:
            return None
        return min(1.0, max(0.0, (now[1] - last[1]) / ((now[0] - last[0]) * self._quota_cores)))

    @property
    def has_gpu(self) -> bool:
        return self._nvml is not None and self._nvml.present

    def _cpu_util(self) -> float:
        if self._cpus is None:
            return float(psutil.cpu_percent(interval=None)) / 100.0
        per_core = psutil.cpu_percent(interval=None, percpu=True)
        mine = [per_core[i] for i in self._cpus if i < len(per_core)]
        return sum(mine) / (100.0 * len(mine)) if mine else float(sum(per_core)) / (100.0 * max(1, len(per_core)))

    def _cpu_shares(self) -> tuple[float, float | None]:
        """(cpu_util, own_cpu_util) on one base: the quota where it binds and reads, else the cores."""
        busy = self._cpu_util()  # read every sample, so that a fallback covers one sample too
        group = self._group_share()
        if group is not None and self._quota_cores is not None:
            self.cpu_source = self._quota_source
            return group, self._own_share(self._quota_cores)
        self.cpu_source = self._busy_source
        return busy, self._own_share(self._cores)

    def __call__(self) -> ResourceSample:
        cpu_util, own = self._cpu_shares()
        mem = psutil.virtual_memory()
        freq_mhz: float | None = None
        with contextlib.suppress(Exception):
            freq = psutil.cpu_freq()
            if freq is not None and freq.current > 0:
                freq_mhz = float(freq.current)
        battery_percent: float | None = None
        plugged: bool | None = None
        sensors_battery = getattr(psutil, "sensors_battery", None)
        if sensors_battery is not None:
            with contextlib.suppress(Exception):
                battery = sensors_battery()
                if battery is not None:
                    battery_percent = float(battery.percent)
                    plugged = None if battery.power_plugged is None else bool(battery.power_plugged)
        return ResourceSample(
            time_s=self._clock(),
            cpu_util=min(1.0, max(0.0, cpu_util)),
            mem_available_bytes=int(mem.available),
            mem_total_bytes=int(mem.total),
            cpu_freq_mhz=freq_mhz,
            gpu_util=self._nvml.util() if self._nvml is not None else None,
            battery_percent=battery_percent,
            battery_plugged=plugged,
            temperature_c=_hottest_temperature_c(),
            own_cpu_util=own,
        )

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


def _hottest_temperature_c() -> float | None:
    sensors = getattr(psutil, "sensors_temperatures", None)
    if sensors is None:
        return None
    try:
        readings = sensors()
    except Exception:  # noqa: BLE001 - unreadable sensors read as absent
        return None
    values = [float(t.current) for entries in readings.values() for t in entries if t.current is not None]
    return max(values) if values else None


class ResourceMonitor:
    """Calls ``sampler`` every ``1 / frequency_hz`` seconds on a daemon thread and on demand.

    Keeps the last ``history_len`` samples. ``on_sample`` (optional) is called with each
    new sample, on the thread that took it. A sampler that raises on the thread is
    counted (``error_count``, ``last_error``) and the loop goes on; ``sample_now`` raises
    a :class:`DeviceError` instead.
    """

    def __init__(
        self,
        sampler: Sampler | None = None,
        frequency_hz: float = 1.0,
        history_len: int = 600,
        on_sample: Callable[[ResourceSample], None] | None = None,
    ) -> None:
        if not frequency_hz > 0:
            raise UsageError(f"monitor frequency_hz must be > 0, got {frequency_hz}")
        if history_len < 1:
            raise UsageError(f"monitor history_len must be >= 1, got {history_len}")
        self._owns_sampler = sampler is None
        self._sampler: Sampler = sampler if sampler is not None else PsutilSampler()
        self.frequency_hz = float(frequency_hz)
        self._on_sample = on_sample
        self._history: deque[ResourceSample] = deque(maxlen=history_len)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error_count = 0
        self.last_error: BaseException | None = None

    @property
    def period_s(self) -> float:
        return 1.0 / self.frequency_hz

    @property
    def cpu_source(self) -> str | None:
        """What the sampler's last CPU figure is read from (:attr:`PsutilSampler.cpu_source`); None
        where it reads no live CPU."""
        source = getattr(self._sampler, "cpu_source", None)
        return source if isinstance(source, str) else None

    def use_cpu_quota(self, cores: float) -> bool:
        """Pass a CPU quota no kernel file holds to the sampler (:meth:`PsutilSampler.use_cpu_quota`);
        False where the sampler reads no live CPU (a test's or a replay's own). Before :meth:`start`."""
        if self.running:
            raise UsageError("the CPU quota is set before the resource monitor starts")
        use = getattr(self._sampler, "use_cpu_quota", None)
        if use is None:
            return False
        use(cores)
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def latest(self) -> ResourceSample | None:
        with self._lock:
            return self._history[-1] if self._history else None

    def history(self) -> list[ResourceSample]:
        """The kept samples, oldest first (a copy)."""
        with self._lock:
            return list(self._history)

    def sample_now(self) -> ResourceSample:
        """Take one sample on the calling thread, record it and return it."""
        try:
            sample = self._sampler()
        except Exception as exc:
            raise DeviceError(f"resource sampler failed: {type(exc).__name__}: {exc}") from exc
        self._record(sample)
        return sample

    def _record(self, sample: ResourceSample) -> None:
        with self._lock:
            self._history.append(sample)
        if self._on_sample is not None:
            self._on_sample(sample)

    def _loop(self) -> None:
        period_s = self.period_s
        next_s = time.monotonic()
        while not self._stop.is_set():
            try:
                self._record(self._sampler())
            except Exception as exc:  # noqa: BLE001 - keep monitoring; the failure is counted
                self.error_count += 1
                self.last_error = exc
            next_s += period_s
            now_s = time.monotonic()
            if next_s < now_s:  # fell behind (slow sampler, suspended process): do not burst
                next_s = now_s
            self._stop.wait(next_s - now_s)

    def start(self) -> None:
        """Start the sampling thread (the first sample is taken at once). Starting twice is an error."""
        if self.running:
            raise UsageError("resource monitor is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="hmt-resource-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it (idempotent). Closes a sampler the monitor created."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                raise DeviceError(f"resource monitor thread did not stop within {timeout_s} s")
        if self._owns_sampler and isinstance(self._sampler, PsutilSampler):
            self._sampler.close()

    def __enter__(self) -> ResourceMonitor:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
