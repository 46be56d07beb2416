"""A logging filter that lets a repeated message through at most a few times per interval.

Under a flood of hostile connections the same warning (an invalid request, a dropped
connection, accept() out of descriptors) can be logged thousands of times a second: the
offload peer's log grew 239 MB in 40 s under 1,100 slow sockets. :class:`RepeatFilter`
keys records by logger and format string (not the formatted text, which carries addresses
and counts), lets ``burst`` of each through per ``interval_s``, and when an interval with
drops ends, says on the next record it lets through how many it dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

# Loggers a server's hostile traffic writes to (uvicorn's protocol warnings, our connection layer).
NOISY_LOGGERS = ("uvicorn.error", "uvicorn.protocols", "hmt.serve.http.connections", "hmt.offload")
_MAX_KEYS = 1024


class RepeatFilter(logging.Filter):
    """At most ``burst`` records per (logger, message format) per ``interval_s``; the rest are counted and dropped."""

    def __init__(self, burst: int = 5, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.interval_s = interval_s
        self.clock = clock
        self.dropped_total = 0
        self._lock = threading.Lock()
        self._windows: dict[tuple[str, str], list[float]] = {}  # key -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg)[:200])
        now = self.clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window[0] >= self.interval_s:
                dropped = 0 if window is None else int(window[2])
                if len(self._windows) >= _MAX_KEYS:
                    self._windows.clear()
                self._windows[key] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} more like this dropped in the last {self.interval_s:g} s]"
                return True
            if window[1] < self.burst:
                window[1] += 1
                return True
            window[2] += 1
            self.dropped_total += 1
            return False


def install(filter_: RepeatFilter, names: Iterable[str] = NOISY_LOGGERS) -> Callable[[], None]:
    """Attach ``filter_`` to the loggers ``names``; returns a function that detaches it."""
    loggers = [logging.getLogger(name) for name in names]
    for log in loggers:
        log.addFilter(filter_)

    def remove() -> None:
        for log in loggers:
            log.removeFilter(filter_)

    return remove
