"""NVIDIA GPU energy through NVML: the total-energy counter (Volta and newer, mJ since the
driver loaded), or polled board power where the counter is not supported.

NVML is reached through ``pynvml`` (the ``nvidia-ml-py`` package) when it is installed,
otherwise through the driver's own library, ``libnvidia-ml.so.1``, with ctypes: every
machine with an NVIDIA driver has that library, so a GPU host without the Python package
(or without a way to install it) can still be metered.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from hmt.errors import DeviceError
from hmt.profile.power.base import PollingSource
from hmt.runtime.gpus import nvml_handle

NVML_SUCCESS = 0
NVML_LIBRARIES = ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll")


class NvmlCallError(RuntimeError):
    """A failed NVML call through ctypes (``code`` is NVML's nvmlReturn_t)."""

    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function}: {message} (NVML error {code})")
        self.code = code


class CtypesNvml:
    """The few NVML calls a power source needs, through ctypes, with pynvml's names and
    return conventions (values returned, failures raised)."""

    def __init__(self, library: str | None = None) -> None:
        names = (library,) if library else NVML_LIBRARIES
        errors = []
        for name in names:
            try:
                self._lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                errors.append(f"{name}: {exc}")
        else:
            found = ctypes.util.find_library("nvidia-ml")
            if found is None:
                raise OSError("; ".join(errors) or "libnvidia-ml not found")
            self._lib = ctypes.CDLL(found)
        self._lib.nvmlErrorString.restype = ctypes.c_char_p
        self._lib.nvmlErrorString.argtypes = [ctypes.c_int]

    def _call(self, function: str, *args: Any) -> None:
        fn = getattr(self._lib, function)
        code = int(fn(*args))
        if code != NVML_SUCCESS:
            text = self._lib.nvmlErrorString(code)
            raise NvmlCallError(function, code, text.decode(errors="replace") if text else "unknown error")

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._call("nvmlInit_v2")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        return int(count.value)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:  # noqa: N802
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes | str) -> ctypes.c_void_p:  # noqa: N802
        handle = ctypes.c_void_p()
        text = uuid.encode() if isinstance(uuid, str) else uuid
        self._call("nvmlDeviceGetHandleByUUID", ctypes.c_char_p(text), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p) -> str:  # noqa: N802
        buffer = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetName", handle, buffer, ctypes.c_uint(len(buffer)))
        return buffer.value.decode(errors="replace")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: ctypes.c_void_p) -> int:  # noqa: N802
        energy_mj = ctypes.c_ulonglong(0)
        self._call("nvmlDeviceGetTotalEnergyConsumption", handle, ctypes.byref(energy_mj))
        return int(energy_mj.value)

    def nvmlDeviceGetPowerUsage(self, handle: ctypes.c_void_p) -> int:  # noqa: N802
        power_mw = ctypes.c_uint(0)
        self._call("nvmlDeviceGetPowerUsage", handle, ctypes.byref(power_mw))
        return int(power_mw.value)


def _nvml() -> Any:
    """pynvml when importable, else NVML through ctypes; initialised. DeviceError when neither works."""
    try:
        import pynvml

        nv: Any = pynvml
        how = "pynvml"
    except ImportError:
        try:
            nv = CtypesNvml()
        except OSError as exc:
            raise DeviceError(
                "no NVIDIA GPU / NVML: the pynvml module is not installed (pip install nvidia-ml-py) and the "
                f"driver's NVML library could not be loaded ({exc}); --power nvml needs an NVIDIA driver"
            ) from exc
        how = "ctypes"
    try:
        nv.nvmlInit()
    except Exception as exc:
        raise DeviceError(f"NVML did not initialise through {how} ({exc}): no NVIDIA driver or GPU on this "
                          "machine") from exc
    return nv


class NvmlSource(PollingSource):
    name = "nvml"

    def __init__(self, *, index: int = 0, interval_s: float = 0.02) -> None:
        """``index``: the CUDA device as this process sees it (CUDA_VISIBLE_DEVICES applied)."""
        super().__init__(interval_s=interval_s)
        self._nv = _nvml()
        self.binding = "ctypes" if isinstance(self._nv, CtypesNvml) else "pynvml"
        # The GPU this process runs on, not NVML's GPU ``index`` of the host.
        self.handle, self.nvml_gpu = nvml_handle(self._nv, index)
        try:
            self._nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.cumulative = True
            self.mode = "total-energy counter"
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported on pre-Volta GPUs
            self.cumulative = False
            self.mode = "polled board power (no energy counter on this GPU)"

    def gpu_name(self) -> str:
        name = self._nv.nvmlDeviceGetName(self.handle)
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def read(self) -> float:
        if self.cumulative:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self.handle)) / 1000.0  # mJ -> J
        return float(self._nv.nvmlDeviceGetPowerUsage(self.handle)) / 1000.0  # mW -> W

    def describe(self) -> str:
        return f"nvml ({self.mode}, through {self.binding}, host GPU {self.nvml_gpu})"
