"""The x86-64 bundle serves from a fresh virtual environment that has no torch (slow: pip)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
# hmt's required dependencies are the device half's: read them, so that this list cannot drift.
ON_DEVICE = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


@pytest.mark.slow
def test_bundle_serves_without_torch(x86_bundle: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    installed = subprocess.run([*pip, *ON_DEVICE], capture_output=True, text=True)
    if installed.returncode != 0:
        pytest.skip(f"no package index reachable for the on-device dependencies: {installed.stderr[-300:]}")
    subprocess.run([*pip, "--no-deps", str(REPO)], check=True)
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None, "
                            "u.find_spec('onnx') is None)"], capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["True", "True"]
    scenario = tmp_path / "scenario.csv"
    scenario.write_text("time_s,cpu_load,battery_pct,latency_budget_ms\n0,0.0,80,50\n2,0.5,40,50\n4,0.0,20,50\n")
    served = subprocess.run(
        [str(venv / "bin" / "hmt"), "serve", str(x86_bundle), "--port", "0", "--engine", "onnxruntime",
         "--scenario", str(scenario), "--clients", "2", "--rate-hz", "40", "--json"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""},
    )
    assert served.returncode == 0, served.stderr[-2000:]
    summary = json.loads(served.stdout)["summary"]
    assert summary["requests"] > 50 and summary["failed"] == 0 and summary["via"] == "api"
