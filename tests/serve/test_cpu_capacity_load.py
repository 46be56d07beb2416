"""The load index is the busy share of the CPU serve may use: a cgroup quota (or serve.json
``cpu_cores``) below the allowed cores scales the cores' busy share up, so a container limited to a
quarter of a core reads a saturated CPU when its quota is spent, not a light load."""

from __future__ import annotations

import os
import time

import pytest

from hmt.errors import UsageError
from hmt.runtime.settings import ServeSettings
from hmt.serve.deciding.monitor import PsutilSampler

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_quarter_core_capacity_reads_four_times_the_cores_busy_share(monkeypatch: pytest.MonkeyPatch) -> None:
    core = min(os.sched_getaffinity(0))
    # psutil's busy share (since its last call, module-wide) faked: every core at ``busy[0]`` %
    busy = [20.0]
    monkeypatch.setattr("psutil.cpu_percent",
                        lambda interval=None, percpu=False: [busy[0]] * (os.cpu_count() or 1) if percpu else busy[0])
    machine_has_more = (os.cpu_count() or 1) > 1
    whole = PsutilSampler(use_nvml=False, cpus=[core], capacity_cores=1.0)
    quarter = PsutilSampler(use_nvml=False, cpus=[core], capacity_cores=0.25)
    assert quarter.capacity_cores == 0.25 and whole.capacity_cores == 1.0
    if machine_has_more:  # pinned to one core of several: per-core readings, scaled by 1 and by 4
        assert whole().cpu_util == pytest.approx(0.2) and quarter().cpu_util == pytest.approx(0.8)
        busy[0] = 30.0
        assert whole().cpu_util == pytest.approx(0.3) and quarter().cpu_util == 1.0  # 4 x 30 %: capped
    # serve's own share on the same two bases: a quarter of the wall time spent spinning
    whole.prime()
    quarter.prime()
    for _ in range(4):
        _spin(0.025)
        time.sleep(0.075)
    own_whole, own_quarter = whole._own_share(), quarter._own_share()
    assert own_whole is not None and own_quarter is not None and own_whole < 0.6
    assert own_quarter == pytest.approx(min(1.0, 4 * own_whole), abs=0.05)


def test_capacity_above_the_cores_is_the_cores_and_a_bad_setting_is_refused() -> None:
    core = min(os.sched_getaffinity(0))
    assert PsutilSampler(use_nvml=False, cpus=[core], capacity_cores=8.0).capacity_cores == 1.0
    assert ServeSettings.from_mapping({"cpu_cores": 0.25}).cpu_cores == 0.25
    for bad in (0, -1, "half", True, float("inf")):
        with pytest.raises(UsageError, match="cpu_cores"):
            ServeSettings.from_mapping({"cpu_cores": bad})
