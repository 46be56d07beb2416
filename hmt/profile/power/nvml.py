"""NVIDIA GPU energy through NVML: the total-energy counter (Volta and newer, mJ since the
driver loaded), or polled board power where the counter is not supported."""

from __future__ import annotations

from typing import Any

from hmt.errors import DeviceError
from hmt.profile.power.base import PollingSource


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise DeviceError("--power nvml needs the pynvml module: pip install nvidia-ml-py") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise DeviceError(f"NVML did not initialise ({exc}): no NVIDIA driver or GPU on this machine") from exc
    return pynvml


class NvmlSource(PollingSource):
    name = "nvml"

    def __init__(self, *, index: int = 0, interval_s: float = 0.02) -> None:
        super().__init__(interval_s=interval_s)
        self._nv = _nvml()
        count = self._nv.nvmlDeviceGetCount()
        if not 0 <= index < count:
            raise DeviceError(f"NVML: no GPU {index}; this machine has {count}")
        self.handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        try:
            self._nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.cumulative = True
            self.mode = "total-energy counter"
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported on pre-Volta GPUs
            self.cumulative = False
            self.mode = "polled board power (no energy counter on this GPU)"

    def read(self) -> float:
        if self.cumulative:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)) / 1000.0  # mJ -> J
        return float(self._nv.nvmlDeviceGetPowerUsage(self.handle)) / 1000.0  # mW -> W

    def describe(self) -> str:
        return f"nvml ({self.mode})"
