"""Power sources: one module per source, each optional and failing with a DeviceError that
says exactly what is missing. ``registry.POWER_SOURCES`` lists them."""

from hmt.profile.power.base import PollingSource, PowerSource, PowerTrace, Window, trace_from_cumulative
from hmt.profile.power.registry import POWER_SOURCES, create_power_source

__all__ = [
    "POWER_SOURCES",
    "PollingSource",
    "PowerSource",
    "PowerTrace",
    "Window",
    "create_power_source",
    "trace_from_cumulative",
]
