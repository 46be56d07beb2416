"""Interleaved end-to-end timing: the schedule, and drift on a machine whose speed steps mid-run."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from hmt.errors import UsageError
from hmt.profile import load_profile, profile_device, stages
from hmt.profile.interleave import InterleaveSettings, interleaved_schedule, time_interleaved
from hmt.profile.parsers import spread
from hmt.profile.predictor import Predictor
from hmt.profile.timing import Conditions, Measurement
from hmt.profile.validate import Drift, validate_variants

from .test_profile_composition import _profile
from .test_profile_pipeline import _options


def test_schedule_visits_every_variant_once_per_round_in_a_seeded_shuffled_order() -> None:
    schedule = interleaved_schedule(23, rounds=4, group_size=10, rng=np.random.default_rng(7))
    assert [sorted(orders[0]) for orders in schedule] == [list(range(10)), list(range(10, 20)), [20, 21, 22]]
    for orders in schedule:
        assert len(orders) == 4 and all(sorted(o) == sorted(orders[0]) for o in orders)
    assert len({tuple(o) for o in schedule[0]}) > 1  # the order changes from round to round
    assert schedule == interleaved_schedule(23, rounds=4, group_size=10, rng=np.random.default_rng(7))
    assert schedule != interleaved_schedule(23, rounds=4, group_size=10, rng=np.random.default_rng(8))
    with pytest.raises(ValueError):
        InterleaveSettings(rounds=0)


class SteppingMachine:
    """A fake clock (ns) and runs that advance it; from ``step_at_ns`` on, everything takes
    ``factor`` times longer (a clock drop, a neighbour arriving)."""

    def __init__(self, *, step_at_ns: float = math.inf, factor: float = 1.0) -> None:
        self.t = 0
        self.step_at_ns = step_at_ns
        self.factor = factor
        self.calls: list[int] = []

    def clock(self) -> int:
        return self.t

    def run(self, base_ms: float, label: int = -1) -> Callable[[], object]:
        def go() -> None:
            self.calls.append(label)
            slow = self.factor if self.t >= self.step_at_ns else 1.0
            self.t += int(base_ms * slow * 1e6)

        return go


BASE = [0.3 + 0.17 * k for k in range(12)]  # ms per run of each variant at full speed


def _time(machine: SteppingMachine, *, rounds: int, group_size: int = 10, seed: int = 0) -> Any:
    return time_interleaved(lambda i: machine.run(BASE[i], i), len(BASE), reference=machine.run(0.5), warmup=2,
                            repeats=20, rng=np.random.default_rng(seed),
                            settings=InterleaveSettings(rounds=rounds, group_size=group_size), min_window_s=0.0,
                            clock=machine.clock)


def _spread_of_ratio(values: Sequence[float]) -> float:
    ratios = [v / b for v, b in zip(values, BASE, strict=True)]
    return max(ratios) / min(ratios)


def test_every_variant_gets_the_same_timed_runs_and_a_steady_machine_shows_no_drift() -> None:
    machine = SteppingMachine()
    result = _time(machine, rounds=5)
    assert result.runs_per_round == [4] * len(BASE)  # ceil(20 / 5)
    assert [m.n for m in result.measurements] == [20] * len(BASE)
    timed = [c for c in machine.calls if c >= 0]
    # warm-up/pilot 2 + per round (1 re-warm + 4 timed) x 5 rounds
    assert all(timed.count(i) == 2 + 5 * 5 for i in range(len(BASE)))
    assert [m.median_ms for m in result.measurements] == pytest.approx(BASE, rel=1e-6)
    assert result.normalised_ms == pytest.approx(BASE, rel=1e-6)
    assert result.drift_ratio == pytest.approx(1.0)
    assert len(result.reference_rounds) == 2 * 5  # groups of 10 and 2, 5 rounds each


def test_a_speed_step_shows_in_the_reference_and_not_between_interleaved_variants() -> None:
    total = SteppingMachine()
    _time(total, rounds=5)
    for step_share in (0.3, 0.5, 0.7):
        # Interleaved: the reference sees the step; every variant saw the same mixture of
        # fast and slow rounds, so their ratios to the truth stay together.
        machine = SteppingMachine(step_at_ns=step_share * total.t, factor=1.7)
        result = _time(machine, rounds=5, group_size=12)
        assert result.drift_ratio == pytest.approx(1.7, rel=0.02)
        # Normalised: each visit scaled by the reference around it: consistent to 2%.
        assert _spread_of_ratio(result.normalised_ms) < 1.02
        raw = [m.median_ms for m in result.measurements]
        if step_share != 0.5:  # most rounds on one side of the step: the raw medians agree too
            assert _spread_of_ratio(raw) < 1.02
        else:  # the step mid-run: a raw median may land on either side (reported, not hidden)
            assert _spread_of_ratio(raw) <= 1.7 + 1e-6
    # The old scheme (each variant timed alone, one after the other): the variants timed after
    # the step read 1.7x slow, the ones before it right.
    machine = SteppingMachine(step_at_ns=0.5 * total.t, factor=1.7)
    sequential = _time(machine, rounds=1, group_size=12)
    assert _spread_of_ratio([m.median_ms for m in sequential.measurements]) == pytest.approx(1.7, rel=0.02)


class FakeRunner:
    """Prepare/time on the stepping machine, for validate_variants."""

    engine = "fake"
    version = "0"

    def __init__(self, machine: SteppingMachine, base: dict[str, float], *, interleaves: bool = True) -> None:
        self.machine = machine
        self.base = base
        self.interleaves = interleaves

    def prepare(self, module: Any, shape: Sequence[int], *, seed: int = 0) -> Callable[[], object]:
        return self.machine.run(self.base[module.arch_id])

    def time(self, module: Any, shape: Sequence[int], *, warmup: int, repeats: int) -> Measurement:
        fn = self.prepare(module, shape)
        samples = []
        for _ in range(repeats):
            t0 = self.machine.t
            fn()
            samples.append((self.machine.t - t0) / 1e6)
        s = spread(samples)
        return Measurement(s.median, s.p10, s.p90, s.iqr, s.n, warmup, Conditions(None, 0.0, 0.0), "now")


class FakeNet:
    def variant_blocks(self, arch: Any) -> list[tuple[str, str]]:
        return list(arch.pairs)

    def materialize(self, arch: Any) -> Any:
        return SimpleNamespace(arch_id=arch.arch_id, input_shape=(3, 8, 8))


def _archs() -> list[Any]:
    from .test_profile_composition import VARIANTS

    return [SimpleNamespace(arch_id=f"v{k}", pairs=pairs) for k, pairs in enumerate(VARIANTS)]


class CycleSpace:
    def __init__(self, archs: list[Any]) -> None:
        self.archs = archs

    def sample(self, rng: np.random.Generator) -> Any:
        return self.archs[int(rng.integers(len(self.archs)))]


@pytest.mark.parametrize("interleaves", [True, False])
def test_validation_reports_raw_and_normalised_and_keeps_the_loaded_run(interleaves: bool) -> None:
    archs = _archs()
    predictor = Predictor(_profile())
    # Each variant's true time = its raw block-table sum; the machine slows 1.6x early on.
    base = {a.arch_id: predictor.raw_block_sum_ms(a.pairs) for a in archs}
    base["ref"] = 0.2
    machine = SteppingMachine(step_at_ns=2e6, factor=1.6)
    runner = FakeRunner(machine, base, interleaves=interleaves)
    drift = Drift(machine.run(0.2), "ref", np.random.default_rng(0), InterleaveSettings(rounds=3),
                  clock=machine.clock)
    result = validate_variants(FakeNet(), CycleSpace(archs), predictor, runner, n=3,  # type: ignore[arg-type]
                               rng=np.random.default_rng(1), warmup=1, repeats=6, load_processes=1, drift=drift)
    idle = result.table[result.table.condition == "idle"]
    assert len(idle) == 3 and len(result.table[result.table.condition == "loaded"]) == 3
    assert result.loaded is not None
    if interleaves:
        # Raw: everything measured slow (the step came early); normalised to the reference's
        # typical level: the same slow level for all, so ranks and ratios are intact.
        assert (idle.measured_ms / idle.raw_predicted_ms).to_numpy() == pytest.approx(1.6, rel=0.02)
        assert result.idle_normalised is not None and result.idle_normalised.kendall_tau == pytest.approx(1.0)
        assert [p for p, _ in drift.phases] == ["validation-idle", "validation-loaded"]
        assert drift.level_ms == pytest.approx(0.2 * 1.6, rel=0.02)
    else:  # TVM-like runner: one after the other, no normalised figures, no drift phases
        assert idle.normalised_ms.isna().all() and result.idle_normalised is None and not drift.phases


def test_profile_records_the_drift_reference(tmp_path: Path, fast: Any) -> None:
    out = tmp_path / "profile"
    result = profile_device(out, _options(supernet=tmp_path / "supernet", validate=4, calibrate_variants=6,
                                          validate_load_processes=0, interleave_rounds=2, drift_normalise=True))
    profile = load_profile(out)
    drift = profile.doc["drift"]
    assert drift["rounds"]["value"] == 2 and drift["ratio"]["value"] >= 1.0
    assert set(drift["phases"]) == {"calibration", "validation-idle"}
    table = profile.table("drift_reference")
    assert set(table.phase) == {"calibration", "validation-idle"} and len(table) == 2 * 2
    assert profile.table("validation").normalised_ms.notna().all()
    assert profile.doc["models"]["latency_composition"]["fitted_to"] == "normalised_ms"
    assert "validation.idle_normalised.mape" in result.summary and "drift.ratio" in result.summary
    assert any(n.startswith("drift:") for n in result.notes)
    with pytest.raises(UsageError, match="--drift-normalise needs"):
        profile_device(tmp_path / "p", _options(supernet=tmp_path / "supernet", validate=4, interleave_rounds=0,
                                                drift_normalise=True))
    # --interleave-rounds 0, or a runner that cannot interleave (TVM): the old sequential scheme.
    assert stages.drift_reference(_options(interleave_rounds=0), object(), fast) is None
    assert stages.drift_reference(_options(), SimpleNamespace(interleaves=False), fast) is None
