"""Micro-benchmarks that run on this machine (I/O: timings in, raw numbers out).

- peak MAC throughput: fp32 GEMM (torch and numpy/BLAS) and a 3x3 convolution (torch),
  single-threaded and with every thread;
- memory bandwidth over working sets from 16 KiB to 256 MiB: copy (read+write) and read
  (BLAS dot), showing the cache plateaus and DRAM;
- cold vs warm reads per working set (the caches flushed before each cold read), from
  which ``parsers.hit_rate_curve`` derives the cache-hit rate (AdaScale eq. 5);
- ``perf stat`` cache counters when the kernel exposes them (detected; otherwise the
  reason is recorded and the timing-based estimate is used).

Timings on a shared machine are noisy; medians of repeats are reported and the spread
kept. Nothing here decides what the numbers mean: see ``parsers`` and ``fits``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np

from hmt.profile.parsers import PerfCounters, Spread, parse_perf_stat_csv, spread

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class BenchmarkSettings:
    """How long and how wide the micro-benchmarks run; ``quick()`` fits a laptop in seconds."""

    gemm_sizes: tuple[int, ...] = (512, 1024, 2048)
    conv_hw: int = 56
    repeats: int = 7
    min_time_s: float = 0.05
    bandwidth_sizes: tuple[int, ...] = tuple(16 * KIB * 2**i for i in range(15))  # 16 KiB .. 256 MiB
    cold_sizes: tuple[int, ...] = tuple(64 * KIB * 4**i for i in range(7))  # 64 KiB .. 256 MiB
    cold_trials: int = 5
    flush_bytes: int = 128 * MIB

    @classmethod
    def quick(cls) -> BenchmarkSettings:
        return cls(
            gemm_sizes=(512, 1024),
            conv_hw=28,
            repeats=5,
            min_time_s=0.02,
            bandwidth_sizes=tuple(16 * KIB * 4**i for i in range(8)),  # 16 KiB .. 256 MiB
            cold_sizes=tuple(64 * KIB * 8**i for i in range(5)),  # 64 KiB .. 256 MiB
            cold_trials=3,
            flush_bytes=96 * MIB,
        )


@dataclass(frozen=True)
class ThroughputResult:
    name: str
    threads: int
    macs: int
    seconds: Spread

    @property
    def gmacs(self) -> float:
        return self.macs / self.seconds.median / 1e9


@dataclass(frozen=True)
class BandwidthPoint:
    size_bytes: int
    copy_gbps: float
    read_gbps: float


@dataclass(frozen=True)
class ColdWarmPoint:
    size_bytes: int
    cold_gbps: float
    warm_gbps: float


def time_call(fn: Callable[[], object], *, repeats: int, min_time_s: float) -> Spread:
    """Per-call seconds: calls are batched until a batch lasts ``min_time_s``; ``repeats`` batches."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time_s or calls >= 1 << 20:
            break
        calls *= 2
    samples = [elapsed / calls]
    for _ in range(repeats - 1):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return spread(samples)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def measure_peak_macs(settings: BenchmarkSettings, *, threads: int, device: str = "cpu") -> list[ThroughputResult]:
    """fp32 GEMM (torch, numpy) and 3x3 conv (torch) throughput. ``device='cuda'`` uses the GPU."""
    import torch

    results: list[ThroughputResult] = []
    generator = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.inference_mode(), torch_threads(threads):
        for n in settings.gemm_sizes:
            a = torch.randn(n, n, generator=generator).to(device)
            b = torch.randn(n, n, generator=generator).to(device)

            def gemm(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
                torch.mm(a, b)
                sync()

            results.append(
                ThroughputResult(f"gemm-torch-{n}", threads, n**3, time_call(gemm, repeats=settings.repeats,
                                                                               min_time_s=settings.min_time_s))
            )
        hw, channels = settings.conv_hw, 64
        x = torch.randn(1, channels, hw, hw, generator=generator).to(device)
        conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False).to(device).eval()
        macs = channels * channels * 9 * hw * hw

        def run_conv() -> None:
            conv(x)
            sync()

        results.append(
            ThroughputResult(f"conv3x3-torch-{channels}x{hw}x{hw}", threads, macs,
                             time_call(run_conv, repeats=settings.repeats, min_time_s=settings.min_time_s))
        )
    if device == "cpu" and threads == (os.cpu_count() or 1):
        # numpy's BLAS keeps its own thread pool (all cores by default), so it is timed
        # only in the all-threads pass, where the row's thread count is true.
        n = settings.gemm_sizes[-1]
        rng = np.random.default_rng(0)
        a_np = rng.standard_normal((n, n), dtype=np.float32)
        b_np = rng.standard_normal((n, n), dtype=np.float32)
        results.append(
            ThroughputResult(f"gemm-numpy-{n}", threads, n**3,
                             time_call(lambda: a_np @ b_np, repeats=settings.repeats, min_time_s=settings.min_time_s))
        )
    return results


def measure_bandwidth(settings: BenchmarkSettings) -> list[BandwidthPoint]:
    """Copy and read bandwidth per working-set size (warm: the buffer is reused)."""
    points = []
    for size in settings.bandwidth_sizes:
        n = size // 4
        src = np.ones(n, dtype=np.float32)
        dst = np.zeros(n, dtype=np.float32)  # touched, so page faults stay out of the timing
        copy = time_call(partial(np.copyto, dst, src), repeats=settings.repeats, min_time_s=settings.min_time_s)
        read = time_call(partial(np.dot, src, src), repeats=settings.repeats, min_time_s=settings.min_time_s)
        points.append(BandwidthPoint(size, 2 * size / copy.median / 1e9, size / read.median / 1e9))
    return points


def measure_cold_warm(settings: BenchmarkSettings) -> list[ColdWarmPoint]:
    """One read right after flushing the caches (cold) vs repeated reads (warm), per size."""
    flush = np.ones(settings.flush_bytes // 4, dtype=np.float32)
    points = []
    for size in settings.cold_sizes:
        buffer = np.ones(size // 4, dtype=np.float32)
        cold = []
        for _ in range(settings.cold_trials):
            flush += 1.0  # writes every line of a buffer larger than the last-level cache
            start = time.perf_counter()
            np.dot(buffer, buffer)
            cold.append(time.perf_counter() - start)
        warm = time_call(partial(np.dot, buffer, buffer), repeats=settings.repeats, min_time_s=settings.min_time_s)
        points.append(ColdWarmPoint(size, size / spread(cold).median / 1e9, size / warm.median / 1e9))
    return points


_PERF_EVENTS = "cache-references,cache-misses,LLC-loads,LLC-load-misses"
_PERF_WORKLOAD = (
    "import numpy as np\n"
    "a = np.ones(1 << 22, dtype=np.float32)\n"
    "for _ in range(50): a.dot(a)\n"
)


def run_perf_stat(timeout_s: float = 60.0) -> PerfCounters:
    """Cache counters of a streaming read through ``perf stat``; unavailable says why."""
    perf = shutil.which("perf")
    if perf is None:
        return PerfCounters(False, {}, "perf is not installed (linux-perf / linux-tools)")
    try:
        proc = subprocess.run(
            [perf, "stat", "-x,", "-e", _PERF_EVENTS, "--", sys.executable, "-c", _PERF_WORKLOAD],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PerfCounters(False, {}, f"perf stat failed to run ({exc})")
    if proc.returncode != 0 and "Permission" in proc.stderr:
        return PerfCounters(False, {}, "perf stat refused: kernel.perf_event_paranoid forbids counters for this user")
    counters = parse_perf_stat_csv(proc.stderr)
    if not counters.available:
        return PerfCounters(False, {}, f"perf stat: {counters.reason} (no PMU access, e.g. a virtual machine)")
    return counters
