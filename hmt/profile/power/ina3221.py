"""Jetson power rails: the INA3221 monitors through sysfs, or the tegrastats tool.

sysfs layouts (both probed):

- L4T 32 (JetPack 4, Nano): ``/sys/bus/i2c/drivers/ina3221x/*/iio:device*/in_power{N}_input``
  (mW) with ``rail_name_{N}``;
- L4T 34+ (JetPack 5+, hwmon): ``/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in{N}_input``
  (mV), ``curr{N}_input`` (mA) and ``in{N}_label``.

The module input rail (POM_5V_IN / VDD_IN) is used when present, else the sum of rails.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from hmt.errors import DeviceError
from hmt.profile.parsers import parse_tegrastats_line, total_rail
from hmt.profile.power.base import PollingSource, PowerSource, PowerTrace

_INPUT_RAILS = ("POM_5V_IN", "VDD_IN", "VIN_SYS_5V0")


def _read_number(path: Path) -> float:
    return float(path.read_text().strip())


def find_rails(root: Path = Path("/sys/bus/i2c/drivers")) -> dict[str, tuple[str, Path, Path | None]]:
    """{rail name: (layout, power-or-voltage file, current file or None)}."""
    rails: dict[str, tuple[str, Path, Path | None]] = {}
    for power_file in sorted(root.glob("ina3221x/*/iio:device*/in_power*_input")):
        channel = power_file.name[len("in_power"): -len("_input")]
        name_file = power_file.parent / f"rail_name_{channel}"
        name = name_file.read_text().strip() if name_file.is_file() else f"rail{channel}"
        rails[name] = ("iio", power_file, None)
    for volt_file in sorted(root.glob("ina3221/*/hwmon/hwmon*/in[0-9]_input")):
        channel = volt_file.name[2:-len("_input")]
        label = volt_file.parent / f"in{channel}_label"
        current = volt_file.parent / f"curr{channel}_input"
        if label.is_file() and current.is_file():
            rails[label.read_text().strip()] = ("hwmon", volt_file, current)
    return rails


class Ina3221Source(PollingSource):
    name = "ina3221"

    def __init__(self, *, rail: str | None = None, interval_s: float = 0.02,
                 root: str | Path = "/sys/bus/i2c/drivers") -> None:
        super().__init__(interval_s=interval_s)
        rails = find_rails(Path(root))
        if not rails:
            raise DeviceError(
                f"INA3221: no power rails under {root}/ina3221x or {root}/ina3221 (not a Jetson, or the "
                "ina3221 driver is not loaded)"
            )
        if rail is not None:
            if rail not in rails:
                raise DeviceError(f"INA3221: no rail {rail!r}; this board has {sorted(rails)}")
            self.rails = {rail: rails[rail]}
        else:
            chosen = next((r for r in _INPUT_RAILS if r in rails), None)
            self.rails = {chosen: rails[chosen]} if chosen else rails

    def read(self) -> float:
        total = 0.0
        for layout, main, current in self.rails.values():
            try:
                if layout == "iio":
                    total += _read_number(main) / 1000.0
                else:
                    assert current is not None
                    total += _read_number(main) / 1000.0 * _read_number(current) / 1000.0
            except (OSError, ValueError) as exc:
                raise DeviceError(f"INA3221: cannot read {main} ({exc})") from exc
        return total

    def describe(self) -> str:
        return f"ina3221 ({'+'.join(self.rails)})"


class TegrastatsSource(PowerSource):
    """Runs ``tegrastats --interval MS`` and reads the module input rail from each line."""

    name = "tegrastats"

    def __init__(self, *, interval_ms: int = 50, binary: str = "tegrastats") -> None:
        path = shutil.which(binary)
        if path is None:
            raise DeviceError(f"tegrastats: {binary!r} is not on PATH (not a Jetson, or L4T tools are missing)")
        self.command = [path, "--interval", str(interval_ms)]
        self._proc: subprocess.Popen[str] | None = None
        self._samples: list[tuple[float, float]] = []
        self._thread: threading.Thread | None = None

    def _reader(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            watts = total_rail(parse_tegrastats_line(line))
            if watts is not None:
                self._samples.append((time.time(), watts))

    def start(self) -> None:
        self._samples = []
        try:
            self._proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        except OSError as exc:
            raise DeviceError(f"tegrastats: cannot start {self.command} ({exc})") from exc
        self._thread = threading.Thread(target=self._reader, name="hmt-tegrastats", daemon=True)
        self._thread.start()

    def stop(self) -> PowerTrace:
        if self._proc is None or self._thread is None:
            raise RuntimeError("tegrastats: stop() before start()")
        self._proc.terminate()
        self._proc.wait(timeout=5)
        self._thread.join(timeout=5)
        self._proc = None
        if len(self._samples) < 2:
            raise DeviceError("tegrastats printed no input-rail power (POM_5V_IN / VDD_IN) during the run")
        data = np.asarray(self._samples)
        return PowerTrace(data[:, 0], data[:, 1], self.name)
