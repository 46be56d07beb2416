"""The power sources hmt knows, by name, imported only when chosen.

The registry is one explicit table (name -> module, class, one-line help) rather than
import side effects, so the CLI's choices are its keys and ``hmt --help`` imports nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from hmt.errors import UsageError
from hmt.profile.power.base import PowerSource


@dataclass(frozen=True)
class PowerSourceSpec:
    name: str
    module: str
    cls: str
    help: str


POWER_SOURCES: dict[str, PowerSourceSpec] = {
    spec.name: spec
    for spec in (
        PowerSourceSpec("monsoon", "hmt.profile.power.monsoon", "MonsoonSource",
                        "Monsoon HVPM over USB through the vendor package 'monsoon' (main channel)"),
        PowerSourceSpec("trace", "hmt.profile.power.trace", "TraceSource",
                        "a recorded CSV trace (Monsoon PowerTool export: time,current,voltage or time,power)"),
        PowerSourceSpec("ina3221", "hmt.profile.power.ina3221", "Ina3221Source",
                        "Jetson INA3221 rails read from sysfs"),
        PowerSourceSpec("tegrastats", "hmt.profile.power.ina3221", "TegrastatsSource",
                        "Jetson rails read from the tegrastats tool"),
        PowerSourceSpec("rapl", "hmt.profile.power.rapl", "RaplSource",
                        "Intel/AMD RAPL package energy through /sys/class/powercap"),
        PowerSourceSpec("nvml", "hmt.profile.power.nvml", "NvmlSource",
                        "NVIDIA GPU total-energy counter through NVML (pynvml)"),
        PowerSourceSpec("fake", "hmt.profile.power.fake", "FakePowerSource",
                        "a simulated meter with known coefficients, for tests and demos"),
    )
}


def create_power_source(name: str, **options: Any) -> PowerSource:
    """Build the named source; unknown names and unknown options are usage errors."""
    spec = POWER_SOURCES.get(name)
    if spec is None:
        raise UsageError(f"unknown power source {name!r}; known: {', '.join(sorted(POWER_SOURCES))}")
    cls = getattr(importlib.import_module(spec.module), spec.cls)
    try:
        source = cls(**options)
    except TypeError as exc:
        raise UsageError(f"power source {name!r}: {exc}") from exc
    if not isinstance(source, PowerSource):
        raise TypeError(f"{spec.module}.{spec.cls} is not a PowerSource")
    return source
