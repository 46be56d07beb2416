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
