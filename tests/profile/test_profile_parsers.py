from __future__ import annotations

import numpy as np
import pytest

from hmt.profile.parsers import (
    find_plateaus,
    hit_rate_curve,
    hit_rate_from_times,
    interpolate_hit_rate,
    parse_cache_size,
    parse_cpuinfo,
    parse_perf_stat_csv,
    parse_tegrastats_line,
    spread,
    total_rail,
)

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
cpu MHz\t\t: 2596.140
flags\t\t: fpu sse4_2 avx avx2 fma avx512f hypervisor

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse4_2 avx avx2 fma avx512f hypervisor
"""

ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd08

processor\t: 1
Features\t: fp asimd evtstrm crc32 cpuid
CPU part\t: 0xd08

Hardware\t: BCM2835
"""


def test_cpuinfo_x86_and_arm() -> None:
    x86 = parse_cpuinfo(X86_CPUINFO)
    assert x86["model"] == "AMD EPYC 7B12" and x86["processors"] == 2
    assert x86["mhz_current"] == pytest.approx(2598.07)
    assert {"avx2", "avx512f", "fma"} <= set(x86["simd"])  # type: ignore[arg-type]
    arm = parse_cpuinfo(ARM_CPUINFO)
    assert arm["model"] == "ARM Cortex-A72" and arm["processors"] == 2 and arm["hardware"] == "BCM2835"
    assert "asimd" in arm["simd"]  # type: ignore[operator]


@pytest.mark.parametrize(("text", "size"),
                         [("32K", 32768), ("2048K", 2 << 20), ("32 MiB", 32 << 20), ("512 KB", 524288)])
def test_cache_size(text: str, size: int) -> None:
    assert parse_cache_size(text) == size


def test_cache_size_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="cache size"):
        parse_cache_size("lots")


def test_perf_stat_counted_and_unsupported() -> None:
    ok = parse_perf_stat_csv("1000,,cache-references,100.00,,\n250,,cache-misses,100.00,,\n")
    assert ok.available and ok.cache_hit_rate == pytest.approx(0.75)
    vm = parse_perf_stat_csv("<not supported>,,cache-references,0,100.00,,\n<not supported>,,cache-misses,0,,\n")
    assert not vm.available and "cache-references <not supported>" in (vm.reason or "")
    empty = parse_perf_stat_csv("")
    assert not empty.available and empty.reason


def test_tegrastats_both_formats() -> None:
    nano = ("RAM 2000/3964MB (lfb 4x4MB) CPU [12%@1479,5%@1479] EMC_FREQ 0% GR3D_FREQ 0% "
            "PLL@24C CPU@26C POM_5V_IN 3452/3452 POM_5V_GPU 0/0 POM_5V_CPU 412/412")
    rails = parse_tegrastats_line(nano)
    assert rails["POM_5V_IN"] == pytest.approx(3.452) and total_rail(rails) == pytest.approx(3.452)
    orin = "RAM 3000/15000MB CPU [1%@729] VDD_IN 5123mW/5123mW VDD_CPU_GPU_CV 812mW/812mW VDD_SOC 1402mW/1402mW"
    rails = parse_tegrastats_line(orin)
    assert total_rail(rails) == pytest.approx(5.123) and rails["VDD_SOC"] == pytest.approx(1.402)
    assert parse_tegrastats_line("RAM 1/2MB") == {} and total_rail({}) is None


def test_plateaus_find_cache_and_dram() -> None:
    sizes = [2**k for k in range(14, 29)]
    bw = [60.0] * 8 + [40.0] * 3 + [15.0] * 4
    levels = find_plateaus(sizes, bw)
    assert [lv.name for lv in levels] == ["cache-1", "cache-2", "dram"]
    assert levels[-1].bandwidth_gbps == pytest.approx(15.0) and levels[0].max_bytes == sizes[7]


def test_hit_rate_formula_and_curve() -> None:
    assert hit_rate_from_times(1.0, t_miss=1.0, t_hit=0.1) == 0.0
    assert hit_rate_from_times(0.1, t_miss=1.0, t_hit=0.1) == 1.0
    assert hit_rate_from_times(0.55, t_miss=1.0, t_hit=0.1) == pytest.approx(0.5)
    # With t_hit -> 0 it is (t0 - t)/t0, the complement of AdaScale eq. 5 as printed.
    t0, t = 2.0, 0.5
    assert hit_rate_from_times(t, t_miss=t0, t_hit=0.0) == pytest.approx(1 - (1 - (t0 - t) / t0))
    sizes = [64 << 10, 512 << 10, 4 << 20, 32 << 20, 256 << 20]
    curve = hit_rate_curve(sizes, [30.0, 40.0, 40.0, 20.0, 12.0], cold_dram_gbps=10.0)
    assert curve[0] == 1.0 and curve[1] == 1.0  # slow small sizes are call overhead, not misses
    assert np.all(np.diff(curve) <= 0) and curve[-1] == pytest.approx((0.1 - 1 / 12) / (0.1 - 1 / 40))
    assert interpolate_hit_rate(1 << 10, sizes, curve) == 1.0
    assert interpolate_hit_rate(1 << 40, sizes, curve) == curve[-1]


def test_spread() -> None:
    s = spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median == 3.0 and s.n == 5 and s.iqr == 2.0
    with pytest.raises(ValueError):
        spread([])
