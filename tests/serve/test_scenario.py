"""Scenario files, the recovery measure, and a short replay end to end (in process and through the API)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from serve_bundles import CLASSES

from hmt.errors import InputError
from hmt.serve.reporting.timeline import recovery
from hmt.serve.running.burn import LoadGenerator
from hmt.serve.running.scenario import DriveOptions, RequestRecord, Scenario
from hmt.serve.running.session import SessionOptions, run_scenario


def test_scenario_parsing_and_lookup() -> None:
    s = Scenario.from_text("time_s,cpu_load,latency_budget_ms,battery_pct\n0,,2,90\n1.5,0.5,1,\n3,,,\n")
    assert s.end_s == 3.0 and s.step_times == [0.0, 1.5, 3.0]
    assert s.at(0.2).latency_budget_ms == 2.0 and s.at(0.2).cpu_load is None
    assert s.at(2.0).cpu_load == 0.5 and s.at(2.0).battery_pct is None and s.at(99).latency_budget_ms is None


@pytest.mark.parametrize(("text", "message"), [
    ("cpu_load\n0.5\n", "time_s column"),
    ("time_s,gpu\n0,1\n", "unknown column"),
    ("time_s,cpu_load\n0,1.5\n", "cpu_load '1.5' outside"),
    ("time_s,latency_budget_ms\n0,0\n", "latency_budget_ms '0' outside"),
    ("time_s,battery_pct\n0,abc\n", "not a number"),
    ("time_s\n2\n1\n", "non-decreasing"),
    ("time_s,cpu_load\n0,0.1\n5,0.2\n3,0.3\n", r"s\.csv:4: time_s 3 is before the previous row's 5"),
    ("time_s,cpu_load\n0,0.1\n\n\n4,2\n", r"s\.csv:5: cpu_load '2' outside"),  # blank lines still count
    ("time_s,cpu_load,cpu_load\n0,0.1,0.9\n", r"\['cpu_load'\] named more than once"),  # the first was unread
    ("time_s,cpu_load,\n0,0.1,7\n", r"s\.csv:2: '7' under the column without a name"),
    ("time_s,,cpu_load,\n0,,0.1,\n", r"unknown column\(s\) \['', ''\]"),  # two unnamed: one cell would go unread
    ("time_s\n", "no rows"),
    ("time_s,cpu_load\n1,0,5\n", "3 cells, the header names 2"),  # a decimal comma read as cpu_load 0
])
def test_scenario_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Scenario.from_text(text, "s.csv")


def _record(t: float, latency: float, budget: float | None = 1.0, status: int = 200) -> RequestRecord:
    return RequestRecord(t, status, latency, latency, latency, "v", 0, 0, None, budget)


def test_recovery_is_the_end_of_the_last_bad_window_and_the_first_clean_one() -> None:
    ok = [_record(0.5, 0.5)]
    burst = [_record(1.0 + 0.05 * i, 2.0 if i < 4 else 0.5) for i in range(20)]  # misses 1.00-1.15
    calm = [_record(2.0 + 0.05 * i, 0.5 if i != 7 else 2.0) for i in range(20)]  # one stray miss: fine
    stuck = [_record(3.0 + 0.05 * i, 0.5 if i % 3 else 2.0) for i in range(20)]  # never settles
    steps = recovery(ok + burst + calm + stuck, [0.0, 1.0, 2.0, 3.0], end_s=4.0)
    assert steps[0]["misses"] == 4 and steps[0]["back_within_budget_s"] == pytest.approx(0.5 + 0.1)
    # The target's reading: the first clean 0.5 s window starts with the last miss of the burst.
    assert steps[0]["first_clean_window_s"] == pytest.approx(0.15)
    assert steps[1] == {"time_s": 2.0, "judged": 20, "misses": 1, "back_within_budget_s": 0.0,
                        "first_clean_window_s": 0.0}
    assert steps[2]["misses"] == 7 and steps[2]["back_within_budget_s"] is None
    assert steps[2]["first_clean_window_s"] is None


@pytest.mark.parametrize("via_api", [False, True])
def test_short_replay_writes_a_timeline(bundle_dir: Path, tmp_path: Path, via_api: bool) -> None:
    from hmt.serve.http.api import ApiOptions
    from hmt.serve.http.server import ServerOptions

    scenario = Scenario.from_text("time_s,cpu_load,latency_budget_ms,battery_pct,memory_budget_mb\n"
                                  "0,,5,90,\n0.6,0.8,5,50,\n1.2,,1.5,20,1.5\n")
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    y = rng.integers(0, CLASSES, 32)
    np.savez(data, x=(np.eye(CLASSES, dtype=np.float32)[y] * 8.0), y=y)  # one-hot inputs: class = label
    result = run_scenario(bundle_dir, scenario, SessionOptions(),
                          DriveOptions(duration_s=1.8, clients=2, rate_hz=60.0),
                          api=ApiOptions() if via_api else None, server=ServerOptions(port=0) if via_api else None,
                          data=data, timeline_dir=tmp_path / "tl", rng=rng)
    s = result.summary
    assert s["failed"] == 0 and s["ok"] > 30 and s["accuracy"] == 1.0 and s["per_exit"] == {"0": s["ok"]}
    assert s["via"] == ("api" if via_api else "in_process")
    assert [step["time_s"] for step in s["steps"]] == [0.6, 1.2]
    assert s["decision_us"]["p50"] < 5000
    assert s["control_loop_errors"] == 0 and s["control_loop_last_error"] is None
    after_cut = [t for t in result.ticks if t.time_s >= 1.2]
    assert after_cut and after_cut[-1].active == "small"  # the memory cut leaves only small
    assert [r.variant for r in result.records if r.time_s > 1.3] == ["small"] * sum(
        r.time_s > 1.3 for r in result.records)
    for name in ("timeline.csv", "requests.csv", "summary.json", "timeline.png"):
        assert (tmp_path / "tl" / name).stat().st_size > 0
    assert json.loads((tmp_path / "tl" / "summary.json").read_text())["ok"] == s["ok"]


@pytest.mark.slow
def test_load_generator_really_burns_cpu() -> None:
    gen = LoadGenerator(cores=1)
    gen.start()
    try:
        gen.set(1.0)
        time.sleep(0.5)
        busy = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("python")]
        assert busy
        psutil.cpu_percent(None)
        time.sleep(1.0)
        assert psutil.cpu_percent(None) > 100 / (psutil.cpu_count() or 1) * 0.6
    finally:
        gen.stop()


def test_a_scenario_over_the_row_bound_is_refused_in_one_line(tmp_path: Path) -> None:
    from hmt.serve.running.scenario import MAX_BYTES, MAX_ROWS

    text = "time_s,cpu_load\n" + "".join(f"{i * 0.001:.3f},{i % 2}\n" for i in range(MAX_ROWS + 1))
    with pytest.raises(InputError, match=f"more than {MAX_ROWS} rows") as caught:
        Scenario.from_text(text, "s.csv")
    assert "\n" not in str(caught.value)
    assert len(Scenario.from_text(text.rsplit("\n", 2)[0] + "\n").rows) == MAX_ROWS
    big = tmp_path / "big.csv"
    big.write_text("time_s\n" + "0\n" * (MAX_BYTES // 2 + 1))
    with pytest.raises(InputError, match="MiB"):
        Scenario.from_csv(big)


def test_a_spreadsheet_export_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_bytes("\ufefftime_s,cpu_load\n0,0.5\n".encode())
    assert Scenario.from_csv(path).at(0).cpu_load == 0.5


def test_recovery_over_many_steps_is_not_quadratic() -> None:
    # a scenario at the row bound, a 100 Hz replay of it: 10 s here with a scan of every request per step
    steps = [0.06 * i for i in range(10_000)]
    records = [_record(0.01 * i, 0.5 if i % 7 else 2.0) for i in range(60_000)]
    began = time.perf_counter()
    out = recovery(records, steps, end_s=600.0)
    assert time.perf_counter() - began < 3.0
    assert len(out) == len(steps) - 1 and sum(s["judged"] for s in out) == 60_000 - 6


def test_a_trailing_comma_is_an_empty_column() -> None:
    """A spreadsheet's export with a trailing comma on every line ('time_s,cpu_load,') was refused as an
    unknown column ''; one column without a name is read as empty."""
    scenario = Scenario.from_text("time_s,cpu_load,\r\n0,0.1,\r\n2,0.5, \r\n", "s.csv")
    assert [(r.time_s, r.cpu_load) for r in scenario.rows] == [(0.0, 0.1), (2.0, 0.5)]


def test_lines_ended_by_cr_alone_are_read() -> None:
    """A file saved with classic Mac line ends (CR alone) stopped serve with csv's 'new-line character
    seen in unquoted field' as an internal error; it reads like any other."""
    scenario = Scenario.from_text("time_s,cpu_load\r0,0.5\r2,0.25\r", "s.csv")
    assert [(r.time_s, r.cpu_load) for r in scenario.rows] == [(0.0, 0.5), (2.0, 0.25)]
    with pytest.raises(InputError, match=r"s\.csv:3: cpu_load '7' outside"):
        Scenario.from_text("time_s,cpu_load\r0,0.5\r2,7\r", "s.csv")
    # What csv itself cannot read (a cell past its field size limit) is one line naming the row too.
    with pytest.raises(InputError, match=r"s\.csv:3: not readable as CSV \(field larger"):
        Scenario.from_text("time_s,cpu_load\n0,0.1\n2," + "9" * 200_000 + "\n", "s.csv")
