"""Background CPU load: real processes that burn a core each, for the load-aware model.

The processes are started by us and ended by their own handles on exit, never by name.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from hmt.profile.fits import LoadModel, fit_load_model, load_index
from hmt.profile.timing import Measurement

_BURN = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


@contextmanager
def background_load(processes: int, *, settle_s: float = 0.3) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start ``processes`` busy-looping Python processes (each ends by itself after 10 min)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(processes):
            procs.append(subprocess.Popen([sys.executable, "-c", _BURN], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        time.sleep(settle_s if processes else 0.0)
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


@dataclass(frozen=True)
class LoadSample:
    label: str
    processes: int
    latency_ms: float
    load_index: float


def measure_load_model(
    timers: Sequence[tuple[str, Callable[[], Measurement]]], *, processes: Sequence[int] = (1,),
) -> tuple[LoadModel, list[LoadSample]]:
    """Time each workload with no extra load and beside each number of burner processes; fit alpha."""
    samples = []
    for count in (0, *processes):
        with background_load(count):
            for label, timer in timers:
                m = timer()
                samples.append(LoadSample(label, count, m.median_ms, load_index(m.conditions.background_util)))
    model = fit_load_model([s.label for s in samples], [s.load_index for s in samples],
                           [s.latency_ms for s in samples])
    return model, samples
