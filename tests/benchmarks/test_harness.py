"""The benchmark harness: results carry what a rerun needs, the README is rendered from them, every area runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness, render

REPO = Path(__file__).resolve().parents[2]
RESULTS = sorted(REPO.glob("benchmarks/*/results/*.json"))


def test_readme_is_rendered_from_the_results() -> None:
    assert (REPO / "benchmarks" / "README.md").read_text() == render.rendered_readme(), (
        "benchmarks/README.md is stale: run python -m benchmarks.render")


def test_every_area_is_a_package_with_a_quick_driver() -> None:
    for area in harness.AREAS:
        assert (REPO / "benchmarks" / area / "__main__.py").is_file(), area
        names = harness.driver_names(area)
        assert names, f"benchmarks/{area} has no driver"
        texts = [(REPO / "benchmarks" / area / f"{n}.py").read_text() for n in names]
        assert any(re.search(r"^\s+quick=\[", t, re.M) for t in texts), f"benchmarks/{area}: no driver has a quick run"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_result_has_the_required_keys_and_no_machine_path(path: Path) -> None:
    text = path.read_text()
    doc = json.loads(text)
    assert [k for k in harness.REQUIRED_KEYS if k not in doc] == []
    assert doc["area"] == path.parent.parent.name and doc["name"] == path.stem
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", doc["revision"]), doc["revision"]
    assert re.match(r"\d{4}-\d{2}-\d{2}", doc["date"]), doc["date"]
    assert doc["claims"], "a committed result states at least one claim"
    assert not re.search(r"(?<![\w$])/(tmp|work|root|home)/", text), "a path of the machine that ran it"


def test_a_malformed_result_is_named(tmp_path: Path) -> None:
    (tmp_path / "serve" / "results").mkdir(parents=True)
    (tmp_path / "serve" / "results" / "x.json").write_text(json.dumps({"area": "serve"}))
    with pytest.raises(render.ResultError, match=r"serve/results/x.json: missing keys name, command"):
        render.load_results(tmp_path)


def test_a_new_area_and_result_are_rendered_without_edits(tmp_path: Path) -> None:
    doc = harness.make_result(area="device", name="probe", command="python -m benchmarks.device", seed=0,
                              baseline="b", results={"x": 1}, claims=[{"claim": "c | d", "figure": "1 ms"}],
                              rev="abc1234")
    harness.write_result(tmp_path / "device" / "results" / "probe.json", doc)
    text = render.render(render.load_results(tmp_path))
    assert "## device" in text and "| c \\| d | 1 ms |" in text and "(device/results/probe.json)" in text


def test_write_result_refuses_a_missing_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing keys"):
        harness.write_result(tmp_path / "r.json", {"area": "serve"})
    assert not list(tmp_path.iterdir())


def test_machine_names_no_host() -> None:
    import socket

    described = json.dumps(harness.machine())
    assert socket.gethostname() not in described
    assert {"cpu", "logical_cpus", "os", "python"} <= set(harness.machine())


@pytest.mark.slow
@pytest.mark.parametrize("area", harness.AREAS)
def test_quick_run_of_every_area(area: str, tmp_path: Path) -> None:
    before = subprocess.run(["git", "status", "--porcelain", "benchmarks"], cwd=REPO, capture_output=True,
                            text=True).stdout
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{area}", "--quick", "--out-dir", str(tmp_path)],
                          cwd=REPO, env=harness.child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = sorted(tmp_path.glob("*.json"))
    assert written, proc.stderr[-2000:]
    for path in written:
        doc = json.loads(path.read_text())
        assert [k for k in harness.REQUIRED_KEYS if k not in doc] == []
        assert doc["command"] == f"python -m benchmarks.{area} --quick --out-dir {tmp_path}"
        assert doc["claims"], f"{path.name}: the quick run states no claim"
    after = subprocess.run(["git", "status", "--porcelain", "benchmarks"], cwd=REPO, capture_output=True,
                           text=True).stdout
    assert after == before, "a quick run wrote into the repository"


def test_placeholders_expand_and_other_braces_stay() -> None:
    """A driver's ``{report}`` / ``{tmp}`` are filled in; a JSON argument's braces pass through untouched
    (str.format raised KeyError on ``--serve-json '{"correction": ...}'``)."""
    from benchmarks.harness import _expand

    args = ["--out", "{report}", "--serve-json", '{"correction": {"overhead": "median"}}', "{tmp}/x", "{other}"]
    assert _expand(args, {"report": "R", "tmp": "T"}) == \
        ["--out", "R", "--serve-json", '{"correction": {"overhead": "median"}}', "T/x", "{other}"]


def test_a_drivers_help_is_printed_and_exits_0(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.supernet", "--out-dir", str(tmp_path), "specialized",
                           "--help"], capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--results" in done.stdout and "Traceback" not in done.stderr and "nothing ran" not in done.stderr
    assert not list(tmp_path.iterdir())  # no result written
