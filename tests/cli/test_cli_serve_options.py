"""hmt's shell completion is on, and serve's start-time settings are refused with the key named, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def hmt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "commands.app", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


@pytest.mark.slow  # two interpreter starts
def test_completion_is_offered_and_generated() -> None:
    result = hmt("--help")
    assert result.returncode == 0 and "--install-completion" in result.stdout
    import os

    script = hmt("--show-completion", "bash", env={**os.environ, "SHELL": "/bin/bash"})
    # Named after the program as invoked (here python -m commands.app; installed, hmt).
    assert script.returncode == 0 and "complete -o default -F" in script.stdout and "COMP_WORDS" in script.stdout


@pytest.mark.slow  # an interpreter start with serve's imports
def test_serve_set_typo_names_the_key(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "serve"))
    from serve_bundles import make_bundle

    bundle = make_bundle(tmp_path / "bundle")
    result = hmt("serve", str(bundle), "--port", "0", "--set", "budgets.latncy_ms=40")
    assert result.returncode == 2, result.stderr
    assert "unknown serve setting 'budgets.latncy_ms'; did you mean budgets.latency_ms" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_help_states_the_loop_rate_it_runs_at() -> None:
    # The help said 1 Hz after the default period became 0.25 s.
    from commands.serve import serve_command
    from hmt.runtime.settings import ServeSettings

    rate_hz = round(1.0 / ServeSettings.monitor_period_s)
    doc = serve_command.__doc__ or ""
    assert f"control loop ({rate_hz} Hz and on demand)" in doc
