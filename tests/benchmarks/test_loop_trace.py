"""The loop trace's scenario options: a budget step as the middle phase, static runs by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serve.loop_trace import middle_phase

REPO = Path(__file__).resolve().parents[2]


def test_the_middle_phase_is_named_by_what_changes() -> None:
    assert middle_phase(1.0, 1.0) == "every core busy"
    assert middle_phase(0.0, 0.6) == "budget x0.6"
    assert middle_phase(0.5, 0.6) == "0.5 of the CPU busy, budget x0.6"
    assert middle_phase(0.0, 1.0) == "unchanged"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.serve.loop_trace", "--synthetic", "--phase-s", "1",
                           "--out", str(tmp_path / "trace.json"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("args", "named"), [(["--budget-step", "0"], "--budget-step"),
                                             (["--static", "nonesuch"], "--static nonesuch")])
def test_bad_options_are_refused_by_name(tmp_path: Path, args: list[str], named: str) -> None:
    done = _run(tmp_path, *args)
    assert done.returncode == 2
    assert named in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_budget_step_runs_beside_the_static_middle_variant(tmp_path: Path) -> None:
    done = _run(tmp_path, "--budget-step", "0.5", "--cpu-load", "0", "--static", "middle")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "trace.json").read_text())
    assert report["budget_step"] == 0.5
    assert list(report["runs"]) == ["adaptive", "static_middle"]
    phases = report["runs"]["adaptive"]["phases"]
    assert [p["phase"] for p in phases] == ["idle", "budget x0.5", "idle again"]
    assert all(p["sent"] > 0 for p in phases)
