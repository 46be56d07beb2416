"""Checks of option values that must name the flag the user typed (not a field of a settings file)."""

from __future__ import annotations

import math

from hmt.errors import UsageError


def check_budget_flags(**flags: float | list[float] | None) -> None:
    """Refuse a budget flag that is not a finite number > 0 (``memory_mb``: >= 0), naming the flag.

    Keyword names are the flags without dashes and with ``_`` for ``-`` (``latency_ms`` is
    ``--latency-ms``); a list is a repeatable flag.
    """
    for name, given in flags.items():
        if given is None:
            continue
        flag = "--" + name.replace("_", "-")
        for value in given if isinstance(given, list) else [given]:
            low_ok = value >= 0 if name == "memory_mb" else value > 0
            if not (math.isfinite(value) and low_ok):
                bound = ">= 0" if name == "memory_mb" else "> 0"
                raise UsageError(f"{flag} {value:g}: expected a finite number {bound}")


def check_device_flag(device: str | None, *, allow_auto: bool = True) -> None:
    """Refuse a ``--device`` torch cannot name (``auto``, ``cpu``, ``cuda``, ``cuda:N``), or CUDA where
    this torch has none, before any work: torch raised a bare RuntimeError (exit 70) once the data
    and the supernet were loaded, or once a whole search had run."""
    if device is None:
        return
    import re

    names = "auto, cpu, cuda or cuda:N" if allow_auto else "cpu, cuda or cuda:N"
    if not (re.fullmatch(r"cpu|cuda(:\d+)?", device) or (allow_auto and device == "auto")):
        raise UsageError(f"--device {device!r}: expected {names}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: CUDA is not available here; use --device cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
