"""Device facts read from this machine (the Profiler half: I/O only, parsing in parsers.py).

CPU model, cores, frequencies, caches, memory, GPU (through NVML where present), OS and
runtime versions. Each reader that cannot find its source says so in ``notes`` instead
of guessing.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from hmt.profile.parsers import parse_cache_size, parse_cpuinfo

_RUNTIMES = ("onnxruntime", "torch", "apache-tvm", "numpy", "onnx")


@dataclass(frozen=True)
class DeviceFacts:
    cpu_model: str
    arch: str
    cores_logical: int
    cores_physical: int | None
    freq_mhz_current: float | None
    freq_mhz_max: float | None
    caches_bytes: dict[str, int]
    memory_bytes: int
    simd: tuple[str, ...]
    os: str
    python: str
    runtimes: dict[str, str | None]
    gpus: tuple[dict[str, Any], ...] = ()
    virtualised: bool = False
    notes: tuple[str, ...] = field(default=())


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def read_cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """Data and unified caches of cpu0, e.g. {"L1d": 32768, "L2": 524288, "L3": 33554432}."""
    caches: dict[str, int] = {}
    base = Path(root)
    if not base.is_dir():
        return caches
    for index in sorted(base.glob("index*")):
        level, kind, size = (_read(str(index / n)) for n in ("level", "type", "size"))
        if not (level and kind and size) or kind.strip() == "Instruction":
            continue
        suffix = "d" if kind.strip() == "Data" else ""
        try:
            caches[f"L{level.strip()}{suffix}"] = parse_cache_size(size.strip())
        except ValueError:
            continue
    return caches


def _max_freq_mhz() -> float | None:
    text = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if text and text.strip().isdigit():
        return int(text.strip()) / 1000.0
    return None


def current_freq_mhz() -> float | None:
    """Mean current frequency of all cores (cpufreq, else /proc/cpuinfo), or None."""
    values = []
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        text = _read(str(path))
        if text and text.strip().isdigit():
            values.append(int(text.strip()) / 1000.0)
    if values:
        return sum(values) / len(values)
    text = _read("/proc/cpuinfo")
    if text:
        parsed = parse_cpuinfo(text)
        mhz = parsed.get("mhz_current")
        return float(mhz) if isinstance(mhz, float) else None
    return None


def read_gpus_nvml() -> tuple[tuple[dict[str, Any], ...], str | None]:
    """GPUs through NVML (``pynvml`` from nvidia-ml-py); a note says why none were read."""
    try:
        import pynvml
    except ImportError:
        return (), "no GPU facts: the pynvml module (package nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return (), f"no GPU facts: NVML did not initialise ({exc})"
    gpus = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpu: dict[str, Any] = {
                "index": index,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory_bytes": int(memory.total),
            }
            for key, call in (
                ("sm_clock_max_mhz", lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                ("mem_clock_max_mhz", lambda h: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                ("power_limit_w", lambda h: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
                ("driver", lambda h: pynvml.nvmlSystemGetDriverVersion()),
            ):
                try:
                    value = call(handle)
                    gpu[key] = value.decode() if isinstance(value, bytes) else value
                except Exception:  # noqa: BLE001 - a field the GPU does not report is skipped
                    continue
            gpus.append(gpu)
    finally:
        pynvml.nvmlShutdown()
    return tuple(gpus), None


def collect_facts(*, with_gpu: bool = True) -> DeviceFacts:
    import psutil

    notes: list[str] = []
    cpuinfo = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    model = str(cpuinfo.get("model") or platform.processor() or platform.machine())
    freq = psutil.cpu_freq()
    freq_max = _max_freq_mhz() or (freq.max if freq and freq.max else None)
    if freq_max is None:
        notes.append("no maximum CPU frequency: no cpufreq in /sys (typical of a virtual machine)")
    caches = read_cache_sizes()
    if not caches:
        notes.append("no cache sizes: /sys/devices/system/cpu/cpu0/cache is absent")
    flags_text = _read("/proc/cpuinfo") or ""
    virtualised = bool(re.search(r"\bhypervisor\b", flags_text))
    if virtualised:
        notes.append("virtual machine (hypervisor flag): hardware counters and cpufreq are usually hidden")
    gpus: tuple[dict[str, Any], ...] = ()
    if with_gpu:
        gpus, note = read_gpus_nvml()
        if note:
            notes.append(note)
    runtimes: dict[str, str | None] = {}
    for name in _RUNTIMES:
        try:
            runtimes[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            runtimes[name] = None
    return DeviceFacts(
        cpu_model=model,
        arch=platform.machine(),
        cores_logical=os.cpu_count() or 1,
        cores_physical=psutil.cpu_count(logical=False),
        freq_mhz_current=current_freq_mhz(),
        freq_mhz_max=freq_max,
        caches_bytes=caches,
        memory_bytes=int(psutil.virtual_memory().total),
        simd=tuple(str(s) for s in simd) if isinstance(simd := cpuinfo.get("simd"), list) else (),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        runtimes=runtimes,
        gpus=gpus,
        virtualised=virtualised,
        notes=tuple(notes),
    )


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_id(facts: DeviceFacts, *, engine: str, engine_version: str | None, processor: str = "cpu") -> str:
    """An nn-Meter style id: hardware + processor + runtime + version, e.g.
    ``amd-epyc-2c-cpu_onnxruntime1.32``."""
    short = slug(re.sub(r"\(R\)|\(TM\)|CPU|Processor|\d+-Core", "", facts.cpu_model))[:32].strip("-")
    if processor != "cpu" and facts.gpus:
        short = slug(str(facts.gpus[0]["name"]))[:32]
    version = ".".join((engine_version or "").split(".")[:2])
    return f"{short}-{facts.cores_logical}c-{processor}_{engine}{version}"
