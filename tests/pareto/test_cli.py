"""``hmt pareto`` as a user meets it: --json, the table, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commands.app import _register, app

from .conftest import NANO

REPO = Path(__file__).resolve().parents[2]
_register()


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args))


def test_json_run_and_human_run(tiny_supernet: Path, tmp_path: Path) -> None:
    common = ["--supernet", str(tiny_supernet), "--profile", str(NANO), "--latency-ms", "0.5", "--latency-ms", "0.8",
              "--evaluations", "8", "--population", "4", "--max-eval-samples", "16", "--threads", "1"]
    result = invoke("pareto", *common, "--out", str(tmp_path / "a"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["metrics"]["evaluations"] == 8 and len(doc["answers"]) == 2
    assert (tmp_path / "a" / "index.json").is_file()
    human = invoke("pareto", *common, "--out", str(tmp_path / "b"))
    assert human.exit_code == 0, human.output
    assert "front (" in human.stdout and "best within each budget" in human.stdout and "saved" in human.stdout
    # Same seed, same options: the same front.
    points = [json.loads((tmp_path / d / "front.json").read_text())["points"] for d in ("a", "b")]
    assert [p["arch_id"] for p in points[0]] == [p["arch_id"] for p in points[1]]


def test_exit_codes(tiny_supernet: Path, tmp_path: Path) -> None:
    base = ["pareto", "--supernet", str(tiny_supernet), "--profile", str(NANO), "--out", str(tmp_path / "o"),
            "--evaluations", "2", "--population", "2", "--max-eval-samples", "8", "--threads", "1"]
    budget = invoke(*base, "--latency-ms", "0.001")
    assert budget.exit_code == 8 and "no variant meets latency <= 0.001 ms" in budget.output
    assert "Traceback" not in budget.output
    assert invoke(*base, "--method", "annealing").exit_code == 2
    assert invoke(*base, "--objectives", "latency_ms").exit_code == 2
    missing = invoke("pareto", "--supernet", str(tmp_path / "nope"), "--profile", str(NANO))
    assert missing.exit_code == 3 and "does not exist" in missing.output
    assert "searching" not in missing.output  # inputs are checked before the banner
    no_profile = invoke("pareto", "--supernet", str(tiny_supernet), "--profile", str(tmp_path / "nope.json"))
    assert no_profile.exit_code == 3 and "--profile" in no_profile.output and "does not exist" in no_profile.output
    assert "searching" not in no_profile.output
    wrong_kind = invoke("pareto", "--supernet", str(tiny_supernet), "--profile", str(tiny_supernet),
                        "--out", str(tmp_path / "o"))
    assert wrong_kind.exit_code == 4 and "expected device-profile" in wrong_kind.output
    assert "hmt pareto --supernet" in invoke("pareto", "--help").output


@pytest.mark.slow
def test_real_process_json_stdout(tiny_supernet: Path, tmp_path: Path) -> None:
    """One real process: stdout carries exactly one JSON document, progress goes to stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "commands.app", "pareto", "--supernet", str(tiny_supernet), "--profile", str(NANO),
         "--out", str(tmp_path / "p"), "--evaluations", "4", "--population", "4", "--max-eval-samples", "8",
         "--threads", "1", "--json"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics"]["evaluations"] == 4
