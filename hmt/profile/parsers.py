"""Pure parsers: raw text and raw timings in, numbers out (nn-Meter's Parser half).

Nothing here touches the machine, so every function is tested on recorded or synthetic
input. The I/O that produces the raw input lives in ``facts.py``, ``benchmarks.py`` and
``power/``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Spread:
    """Median and spread of repeated timings, in the unit they were given in."""

    median: float
    p10: float
    p90: float
    iqr: float
    n: int

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("inf")


def spread(samples: Sequence[float] | np.ndarray) -> Spread:
    values = np.asarray(samples, dtype=float)
    if values.size == 0:
        raise ValueError("no samples")
    q10, q25, q50, q75, q90 = np.percentile(values, [10, 25, 50, 75, 90])
    return Spread(median=float(q50), p10=float(q10), p90=float(q90), iqr=float(q75 - q25), n=int(values.size))


# --------------------------------------------------------------------------- /proc/cpuinfo


def parse_cpuinfo(text: str) -> dict[str, object]:
    """CPU model, logical processor count, current MHz and ISA flags from /proc/cpuinfo.

    Works for x86 ("model name", "flags", "cpu MHz") and arm64 ("Hardware", "Features",
    "CPU part") layouts; fields absent on the platform are left out.
    """
    blocks = [b for b in text.strip().split("\n\n") if b.strip()]
    processors = 0
    mhz: list[float] = []
    model = None
    flags: set[str] = set()
    arm_parts: set[str] = set()
    hardware = None
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if ":" in line:
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
        if "processor" in fields and fields["processor"].isdigit():
            processors += 1
        model = model or fields.get("model name") or fields.get("cpu model")
        hardware = hardware or fields.get("hardware")
        if "cpu mhz" in fields:
            with contextlib.suppress(ValueError):
                mhz.append(float(fields["cpu mhz"]))
        flags |= set((fields.get("flags") or fields.get("features") or "").split())
        if "cpu part" in fields:
            arm_parts.add(fields["cpu part"])
    out: dict[str, object] = {"processors": processors}
    if model:
        out["model"] = model
    elif arm_parts:
        out["model"] = "ARM " + "/".join(sorted(ARM_PARTS.get(p, p) for p in arm_parts))
    if hardware:
        out["hardware"] = hardware
    if mhz:
        out["mhz_current"] = float(np.mean(mhz))
    simd = sorted(f for f in flags if f in SIMD_FLAGS)
    out["simd"] = simd
    return out


SIMD_FLAGS = frozenset(
    {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "neon", "asimd", "sve",
     "asimddp", "fphp"}
)
# Arm "CPU part" ids of cores the targets use (Arm Technical Reference Manuals).
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd07": "Cortex-A57", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76",
             "0x004": "Carmel"}


def parse_cache_size(text: str) -> int:
    """'32K', '2048K', '32 MiB', '512 KB' -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise ValueError(f"cannot read a cache size from {text!r}")
    number, prefix = float(match.group(1)), match.group(2).upper()
    return int(number * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[prefix])


# --------------------------------------------------------------------------- perf stat


@dataclass(frozen=True)
class PerfCounters:
    available: bool
    counts: dict[str, float]
    reason: str | None = None

    @property
    def cache_hit_rate(self) -> float | None:
        refs, misses = self.counts.get("cache-references"), self.counts.get("cache-misses")
        if refs and misses is not None and refs > 0:
            return max(0.0, min(1.0, 1.0 - misses / refs))
        loads, lmiss = self.counts.get("LLC-loads"), self.counts.get("LLC-load-misses")
        if loads and lmiss is not None and loads > 0:
            return max(0.0, min(1.0, 1.0 - lmiss / loads))
        return None


def parse_perf_stat_csv(text: str) -> PerfCounters:
    """Parse ``perf stat -x,`` output (counter value, unit, event name, ...).

    Lines reading ``<not supported>`` or ``<not counted>`` make the counter unavailable;
    if none is counted, ``available`` is False and ``reason`` says why.
    """
    counts: dict[str, float] = {}
    unsupported: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(",")
        if len(parts) < 3 or line.startswith("#"):
            continue
        value, event = parts[0].strip(), parts[2].strip()
        if not event:
            continue
        event = event.split(":")[0].split("/")[-1] or event
        if value.startswith("<"):
            unsupported.append(f"{event} {value}")
            continue
        try:
            counts[event] = float(value)
        except ValueError:
            continue
    if counts:
        return PerfCounters(True, counts, "; ".join(unsupported) or None)
    reason = "; ".join(unsupported) if unsupported else "perf printed no counters"
    return PerfCounters(False, {}, reason)


# --------------------------------------------------------------------------- tegrastats


_TEGRA_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]+)\s+(\d+)(?:mW)?/(\d+)(?:mW)?")


def parse_tegrastats_line(line: str) -> dict[str, float]:
    """Rail power in watts from one tegrastats line.

    JetPack 4 (Nano): ``POM_5V_IN 3452/3452 POM_5V_GPU 0/0`` (mW instant/average);
    JetPack 5+: ``VDD_IN 5123mW/5123mW VDD_CPU_GPU_CV 812mW/812mW``. Returns the instant
    values; an empty dict when the line has no rail.
    """
    rails: dict[str, float] = {}
    for name, instant, _average in _TEGRA_RAIL.findall(line):
        if name.startswith(("POM_", "VDD_", "VIN_")):
            rails[name] = int(instant) / 1000.0
    return rails


def total_rail(rails: dict[str, float]) -> float | None:
    """The rail that measures the whole module input, if the line has one."""
    for name in ("POM_5V_IN", "VDD_IN", "VIN_SYS_5V0"):
        if name in rails:
            return rails[name]
    return None


# --------------------------------------------------------------------------- cache levels and hit rate


@dataclass(frozen=True)
class CacheLevel:
    """A plateau of the bandwidth curve: working sets up to ``max_bytes`` see ``bandwidth_gbps``."""

    name: str
    max_bytes: int
    bandwidth_gbps: float


def find_plateaus(sizes_bytes: Sequence[int], gbps: Sequence[float], *, drop: float = 0.25) -> list[CacheLevel]:
    """Split a bandwidth-vs-working-set curve into plateaus at drops larger than ``drop``.

    The curve is smoothed by a running median of 3 first (single noisy points do not make
    a level). The last plateau is DRAM; the earlier ones are named cache-1, cache-2, ...
    (they need not match L1/L2/L3 one to one: small sizes are limited by call overhead).
    """
    sizes = np.asarray(sizes_bytes, dtype=float)
    bw = np.asarray(gbps, dtype=float)
    if sizes.size != bw.size or sizes.size == 0:
        raise ValueError("sizes and bandwidths must be non-empty and of equal length")
    order = np.argsort(sizes)
    sizes, bw = sizes[order], bw[order]
    smooth = bw.copy()
    for i in range(1, bw.size - 1):
        smooth[i] = float(np.median(bw[i - 1 : i + 2]))
    groups: list[list[int]] = [[0]]
    for i in range(1, smooth.size):
        level = float(np.median(smooth[groups[-1]]))
        if smooth[i] < level * (1.0 - drop):
            groups.append([i])
        else:
            groups[-1].append(i)
    levels = []
    for index, group in enumerate(groups):
        name = "dram" if index == len(groups) - 1 and len(groups) > 1 else f"cache-{index + 1}"
        levels.append(CacheLevel(name, int(sizes[group[-1]]), float(np.median(bw[group]))))
    return levels


def hit_rate_from_times(t_observed: float, *, t_miss: float, t_hit: float) -> float:
    """Cache-hit rate from access times (AdaScale eq. 5, generalised).

    An access costs ``t_hit`` from cache and ``t_miss`` from DRAM, so an observed mean
    ``t = e*t_hit + (1-e)*t_miss`` gives ``e = (t_miss - t) / (t_miss - t_hit)``, clipped
    to [0, 1]. With ``t_hit -> 0`` this is ``(t0 - t_avg) / t0``: the printed eq. 5,
    ``1 - (t0 - t_avg)/t0``, is the complement of that (a miss rate), so we use this form.
    Times are per byte (or per access) at the same granularity.
    """
    if t_miss <= t_hit:
        return 1.0 if t_observed <= t_hit else 0.0
    return float(np.clip((t_miss - t_observed) / (t_miss - t_hit), 0.0, 1.0))


def hit_rate_curve(
    sizes_bytes: Sequence[int], warm_gbps: Sequence[float], *, cold_dram_gbps: float
) -> np.ndarray:
    """Hit rate per working-set size from warm bandwidths and the cold (DRAM) bandwidth.

    Per-byte time is 1/bandwidth; ``t_hit`` is the fastest warm time observed, ``t_miss``
    the cold DRAM time (a read after the caches were flushed). The curve is made
    non-increasing in size: the smallest buffers read slower only from per-call overhead.
    """
    order = np.argsort(np.asarray(sizes_bytes))
    warm = np.asarray(warm_gbps, dtype=float)[order]
    t_obs = 1.0 / warm
    t_hit = float(t_obs.min())
    t_miss = max(1.0 / cold_dram_gbps, float(t_obs.max()))
    rates = np.array([hit_rate_from_times(t, t_miss=t_miss, t_hit=t_hit) for t in t_obs])
    # A larger working set never hits more often; small sizes read slow only from call overhead.
    rates = np.maximum.accumulate(rates[::-1])[::-1]
    out = np.empty_like(rates)
    out[order] = rates
    return out


def interpolate_hit_rate(working_set_bytes: float, sizes_bytes: Sequence[int], rates: Sequence[float]) -> float:
    """Hit rate at a working-set size, interpolated in log2(size); clamped at the ends."""
    sizes = np.log2(np.asarray(sizes_bytes, dtype=float))
    return float(np.interp(np.log2(max(working_set_bytes, 1.0)), sizes, np.asarray(rates, dtype=float)))
