"""Power sources: trace parsing and alignment, sysfs readers on fake trees, clear errors."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from hmt.errors import DeviceError, InputError, UsageError
from hmt.profile.power import POWER_SOURCES, PowerTrace, Window, create_power_source, trace_from_cumulative
from hmt.profile.power.ina3221 import Ina3221Source
from hmt.profile.power.rapl import RaplSource
from hmt.profile.power.trace import align_to_pattern, load_trace, parse_power_csv


def test_monsoon_pymonsoon_export() -> None:
    text = "Time(ms),Main(mA),Main Voltage(V)\n0,100,4.0\n1,200,4.0\n2,300,4.0\n"
    t, p, epoch = parse_power_csv(text, source="x.csv")
    np.testing.assert_allclose(t, [0, 0.001, 0.002])
    np.testing.assert_allclose(p, [0.4, 0.8, 1.2])
    assert not epoch


def test_powertool_and_power_columns() -> None:
    text = "Time (s),Main Avg Current (mA),Main Avg Voltage (V),USB Avg Current (mA)\n0.0,500,5.0,9\n0.5,1000,5.0,9\n"
    _, p, _ = parse_power_csv(text, source="x.csv")
    np.testing.assert_allclose(p, [2.5, 5.0])
    _, p, epoch = parse_power_csv("timestamp,Power (mW)\n1764120000.0,1500\n1764120000.1,2500\n", source="y")
    np.testing.assert_allclose(p, [1.5, 2.5])
    assert epoch


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("a,b\n1,2\n", "no time column"),
        ("time,voltage\n0,1\n1,1\n", "needs a power column"),
        ("time,power\n0,1\n1,oops\n", "line 3"),
        ("time,power\n0,1\n", "at least 2"),
        ("time,power\n0,1\n0,2\n", "do not increase"),
        ("Time (h),power\n0,1\n1,2\n", "unknown time unit"),
        # csv.Error (a field over csv's limit) was an internal error, after the whole profiling run
        ("time,power\n" + "x" * 200_000 + "\n", "not a readable CSV power trace"),
        ("time,power\n0,1\n1,nan\n2,1\n", "data row 2: NaN or infinity"),
    ],
)
def test_malformed_trace_csv(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_power_csv(text, source="bad.csv")


def test_trace_energy_and_coverage() -> None:
    trace = PowerTrace(np.array([0.0, 1.0, 2.0]), np.array([2.0, 2.0, 4.0]), "t")
    assert trace.energy_j(0.0, 1.0) == pytest.approx(2.0)
    assert trace.energy_j(0.5, 1.5) == pytest.approx(2.25)
    with pytest.raises(InputError, match="does not cover|covers"):
        trace.energy_j(1.5, 2.5)
    with pytest.raises(InputError, match="strictly increase"):
        PowerTrace(np.array([0.0, 0.0]), np.array([1.0, 1.0]), "t")


def test_cumulative_counter_to_power() -> None:
    t = np.linspace(100.0, 101.0, 11)
    trace = trace_from_cumulative(t, 3.0 * (t - 100.0), "rapl")
    assert trace.mean_power_w(100.2, 100.8) == pytest.approx(3.0)


def test_alignment_recovers_offset(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    host0 = 1_764_120_000.0
    busy = [(host0 + 1.0, host0 + 1.4), (host0 + 1.8, host0 + 2.2), (host0 + 2.6, host0 + 3.4)]
    offset = host0 - 7.3  # the trace started 7.3 s before host0 on its own clock (0 s)
    t_rel = np.arange(0.0, 20.0, 0.002)
    host = t_rel + offset
    power = np.full_like(t_rel, 2.0) + rng.normal(0, 0.05, size=t_rel.size)
    for s, e in busy:
        power[(host >= s) & (host < e)] += 3.0
    assert align_to_pattern(t_rel, power, busy) == pytest.approx(offset, abs=0.02)
    path = tmp_path / "trace.csv"
    path.write_text("Time (s),Power (W)\n" + "".join(f"{a:.4f},{b:.4f}\n" for a, b in zip(t_rel, power, strict=True)))
    aligned = load_trace(path, sync=busy)
    assert aligned.t_start == pytest.approx(offset, abs=0.02)
    explicit = load_trace(path, start_epoch_s=offset)
    assert explicit.t_start == pytest.approx(offset)
    with pytest.raises(InputError, match="relative"):
        load_trace(path)


def test_trace_source_not_covering_the_run(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    now = time.time()
    path.write_text(f"time,power\n{now - 100:.3f},2.0\n{now - 99:.3f},2.0\n")
    source = create_power_source("trace", path=path)
    source.start()
    trace = source.stop()
    with pytest.raises(InputError, match="does not cover|covers"):
        trace.energy_j(now, now + 1)


def test_registry() -> None:
    assert {"monsoon", "trace", "ina3221", "tegrastats", "rapl", "nvml", "fake"} <= set(POWER_SOURCES)
    with pytest.raises(UsageError, match="unknown power source"):
        create_power_source("joulemeter")
    with pytest.raises(UsageError, match="fake"):
        create_power_source("fake", colour="blue")


def test_rapl_on_a_fake_powercap_tree(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="does not exist"):
        RaplSource(root=tmp_path / "none")
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    with pytest.raises(DeviceError, match="dram"):
        RaplSource(domain="dram", root=tmp_path)
    source = RaplSource(root=tmp_path)
    assert source.read() == pytest.approx(0.9)
    (zone / "energy_uj").write_text("100000\n")  # wrapped past max_energy_range_uj
    assert source.read() == pytest.approx(1.1)


def test_ina3221_both_sysfs_layouts(tmp_path: Path) -> None:
    iio = tmp_path / "ina3221x" / "6-0040" / "iio:device0"
    iio.mkdir(parents=True)
    (iio / "rail_name_0").write_text("POM_5V_IN\n")
    (iio / "in_power0_input").write_text("4200\n")
    (iio / "rail_name_1").write_text("POM_5V_GPU\n")
    (iio / "in_power1_input").write_text("900\n")
    assert Ina3221Source(root=tmp_path).read() == pytest.approx(4.2)  # the input rail, not the sum
    hw = tmp_path / "ina3221" / "1-0040" / "hwmon" / "hwmon3"
    hw.mkdir(parents=True)
    (hw / "in1_label").write_text("VDD_GPU_SOC\n")
    (hw / "in1_input").write_text("5000\n")
    (hw / "curr1_input").write_text("600\n")
    source = Ina3221Source(rail="VDD_GPU_SOC", root=tmp_path)
    assert source.read() == pytest.approx(3.0)
    with pytest.raises(DeviceError, match="no power rails"):
        Ina3221Source(root=tmp_path / "empty")


def test_absent_meters_say_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "Monsoon", None)
    with pytest.raises(DeviceError, match="pip install monsoon"):
        create_power_source("monsoon")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DeviceError, match="nvidia-ml-py"):
        create_power_source("nvml")
    with pytest.raises(DeviceError, match="tegrastats"):
        create_power_source("tegrastats", binary="no-such-tegrastats")


def _fake_monsoon(monkeypatch: pytest.MonkeyPatch, *, connected: bool) -> None:
    """A stand-in for the vendor package: 5 kHz samples at 4 V, 250 mA."""
    package = types.ModuleType("Monsoon")
    hvpm, engine_mod, pmapi = (types.ModuleType(f"Monsoon.{n}") for n in ("HVPM", "sampleEngine", "pmapi"))

    class Protocol:
        DEVICE = object() if connected else None

    class Monitor:
        def setup_usb(self, serial: object = None, protocol: object = None) -> None:
            self.Protocol = Protocol()

        def fillStatusPacket(self) -> None: ...
        def setVout(self, volts: float) -> None: ...
        def closeDevice(self) -> None: ...

    class Channels:
        timeStamp, MainCurrent, USBCurrent, AuxCurrent, MainVoltage, USBVoltage = range(6)  # noqa: N815 (vendor names)

    class Triggers:
        SAMPLECOUNT_INFINITE = 0xFFFFFFFF
        GREATER_THAN = staticmethod(lambda x, y: x > y)

    class SampleEngine:
        def __init__(self, monitor: Monitor) -> None:
            self.stop = None

        def ConsoleOutput(self, flag: bool) -> None: ...
        def enableChannel(self, channel: int) -> None: ...
        def disableChannel(self, channel: int) -> None: ...
        def setTriggerChannel(self, channel: int) -> None: ...
        def setStartTrigger(self, style: object, level: float) -> None: ...

        def setStopTrigger(self, style, level):  # type: ignore[no-untyped-def]
            self.stop = style

        def startSampling(self, samples: int) -> None:
            start = time.time()
            while not self.stop(0, 0):
                time.sleep(0.01)
            self.n = int((time.time() - start) * 5000)

        def getSamples(self) -> list[list[float]]:
            t = [i / 5000 for i in range(self.n)]
            return [t, [250.0] * self.n, [4.0] * self.n]

    hvpm.Monsoon = Monitor  # type: ignore[attr-defined]
    engine_mod.SampleEngine, engine_mod.channels, engine_mod.triggers = SampleEngine, Channels, Triggers  # type: ignore[attr-defined]
    pmapi.USB_protocol = Protocol  # type: ignore[attr-defined]
    for name, module in (("Monsoon", package), ("Monsoon.HVPM", hvpm), ("Monsoon.sampleEngine", engine_mod),
                         ("Monsoon.pmapi", pmapi)):
        monkeypatch.setitem(sys.modules, name, module)
    package.HVPM, package.sampleEngine, package.pmapi = hvpm, engine_mod, pmapi  # type: ignore[attr-defined]


def test_monsoon_source_with_a_stand_in_package(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_monsoon(monkeypatch, connected=True)
    source = create_power_source("monsoon", vout=4.0, probe_usb=False)
    source.start()
    time.sleep(0.2)
    trace = source.stop()
    assert trace.mean_power_w(trace.t_start, trace.t_end) == pytest.approx(1.0)
    assert abs(trace.t_start - time.time()) < 5
    _fake_monsoon(monkeypatch, connected=False)
    absent = create_power_source("monsoon", probe_usb=False)
    with pytest.raises(DeviceError, match="no monitor"):
        absent.start()
    with pytest.raises(DeviceError, match="outside"):
        create_power_source("monsoon", vout=20.0)


def test_window_duration() -> None:
    assert Window("w", 1.0, 3.5, 10).duration_s == 2.5
