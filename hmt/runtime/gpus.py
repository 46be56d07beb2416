"""Which of the host's GPUs this process runs on, in NVML's terms (torch-free: serve reads it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hmt.errors import DeviceError


def visible_gpu(index: int, environ: Mapping[str, str] | None = None) -> int | str:
    """NVML's name for CUDA device ``index`` as this process sees it: CUDA_VISIBLE_DEVICES
    renumbers the GPUs a process sees (``CUDA_VISIBLE_DEVICES=3``: CUDA device 0 is the
    host's GPU 3) while NVML always counts every GPU of the host. Returns NVML's index, or
    the GPU's UUID where the variable names it by UUID. Without the variable the two agree."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= index < len(entries):
        raise DeviceError(f"NVML: no GPU {index}: CUDA_VISIBLE_DEVICES={visible!r} makes {len(entries)} visible")
    entry = entries[index]
    if entry.isdigit():
        return int(entry)
    if entry.startswith(("GPU-", "MIG-")):
        return entry
    raise DeviceError(f"NVML: CUDA_VISIBLE_DEVICES entry {entry!r} is neither an index nor a GPU UUID")


def nvml_handle(nv: Any, index: int = 0) -> tuple[Any, int | str]:
    """(NVML handle, NVML's name for it) of CUDA device ``index`` of this process; ``nv`` is pynvml
    or anything with its calls (initialised). DeviceError when that GPU is not on this machine."""
    gpu = visible_gpu(index)
    if isinstance(gpu, str):
        return nv.nvmlDeviceGetHandleByUUID(gpu), gpu
    count = nv.nvmlDeviceGetCount()
    if not 0 <= gpu < count:
        raise DeviceError(f"NVML: no GPU {gpu}; this machine has {count}")
    return nv.nvmlDeviceGetHandleByIndex(gpu), gpu
