"""serve.json ``cpu_quota_cores``: a CPU quota no kernel file holds (a paced device class, a hypervisor's
cap) reaches the live sampler, which then reads the cgroup's CPU time over it."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_bundles import VariantDef, make_bundle

from hmt.bundle import load_bundle
from hmt.errors import UsageError
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.deciding.monitor import PsutilSampler, ResourceMonitor, ResourceSample
from hmt.serve.running.scenario import ScenarioSampler, ScenarioState


class _Sampler:
    def __init__(self) -> None:
        self.quotas: list[float] = []

    def use_cpu_quota(self, cores: float) -> None:
        self.quotas.append(cores)

    def __call__(self) -> ResourceSample:
        return ResourceSample(0.0, 0.0, 4_000_000_000, 8_000_000_000)


@pytest.mark.parametrize("value", [0, -0.5, "a quarter", True, float("inf")])
def test_a_quota_that_is_no_positive_number_is_refused(value: object) -> None:
    with pytest.raises(UsageError, match="cpu_quota_cores"):
        ServeSettings.from_mapping({"cpu_quota_cores": value})
    assert ServeSettings.from_mapping({"cpu_quota_cores": 0.25}).cpu_quota_cores == 0.25
    assert ServeSettings().cpu_quota_cores is None


def test_the_controller_passes_the_quota_to_its_sampler_through_a_scenario(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b", (VariantDef("big", 0.9, 2.0, 2.0),)))
    live = _Sampler()
    Controller(bundle, ServeSettings.from_mapping({"cpu_quota_cores": 0.8}),
               sampler=ScenarioSampler(ScenarioState(), synthetic_cpu=False, base=live), warmup_runs=1)
    assert live.quotas == [0.8]
    untold = _Sampler()
    Controller(bundle, ServeSettings(), sampler=untold, warmup_runs=1)
    assert untold.quotas == []


def test_the_monitor_forwards_the_quota_before_it_starts_only() -> None:
    live = _Sampler()
    monitor = ResourceMonitor(live, frequency_hz=50.0)
    assert monitor.use_cpu_quota(0.25) and live.quotas == [0.25]
    assert not ResourceMonitor(lambda: live(), frequency_hz=50.0).use_cpu_quota(0.25)  # a replay's own sampler
    monitor.start()
    try:
        with pytest.raises(UsageError, match="before the resource monitor starts"):
            monitor.use_cpu_quota(0.5)
    finally:
        monitor.stop()


def test_the_live_sampler_reads_against_the_quota_it_is_told() -> None:
    sampler = PsutilSampler(use_nvml=False)
    assert sampler.cpu_source.startswith("busy share")
    sampler.use_cpu_quota(0.25)
    assert "quota of 0.25 cores" in sampler.cpu_source  # this process's cgroup, read as the quota's
    sample = sampler()
    assert 0.0 <= sample.cpu_util <= 1.0 and sample.own_cpu_util is not None


def test_status_says_what_the_cpu_figure_is_read_from(tmp_path: Path) -> None:
    bundle = load_bundle(make_bundle(tmp_path / "b", (VariantDef("big", 0.9, 2.0, 2.0),)))
    live = _Sampler()
    live.cpu_source = "cgroup CPU time over its quota of 0.5 cores (a reader)"  # type: ignore[attr-defined]
    c = Controller(bundle, ServeSettings(), sampler=ScenarioSampler(ScenarioState(), synthetic_cpu=False, base=live),
                   warmup_runs=1)
    c.start(background=False)
    try:
        assert c.status()["cpu_source"] == live.cpu_source  # type: ignore[attr-defined]
    finally:
        c.stop()
    replay = ScenarioSampler(ScenarioState(), synthetic_cpu=True, base=live)
    assert replay.cpu_source is None  # the scenario's load stands in for the CPU reading
    untold = Controller(bundle, ServeSettings(), sampler=_Sampler(), warmup_runs=1)
    untold.start(background=False)
    try:
        assert untold.status()["cpu_source"] is None  # a replay's own sampler reads no live CPU
    finally:
        untold.stop()
