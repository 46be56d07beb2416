"""What ``hmt serve`` says about what the user typed, and the archive ``hmt deploy --verify`` takes."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner


def _invoke(*args: str) -> tuple[int, str]:
    from commands.app import _register, app

    _register()
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_a_file_or_a_missing_path_says_what_it_is(tmp_path: Path) -> None:
    image = tmp_path / "cat.jpg"
    image.write_bytes(b"\xff\xd8\xff")
    code, output = _invoke("serve", str(image), "--port", "0")
    assert code == 3 and f"{image}: is a .jpg file, not a bundle; expected a bundle directory" in output
    code, output = _invoke("serve", str(tmp_path / "nope"), "--port", "0")
    assert code == 3 and f"{tmp_path / 'nope'}: does not exist" in output


def test_budget_flags_are_named_as_typed(bundle_dir: Path) -> None:
    code, output = _invoke("serve", str(bundle_dir), "--latency-ms", "-5")
    assert code == 2 and "--latency-ms -5: expected a finite number > 0" in output
    code, output = _invoke("serve", str(bundle_dir), "--memory-mb", "nan")
    assert code == 2 and "--memory-mb nan" in output
    code, output = _invoke("deploy", "--fused", "f", "--pareto", "p", "--target", "x86-64", "--latency-ms", "0")
    assert code == 2 and "--latency-ms 0: expected" in output


def test_unknown_variant_lists_the_variants(bundle_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "commands.app", "serve", str(bundle_dir), "--port", "0",
                           "--variant", "nope"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "unknown variant 'nope'; this bundle's variants: " in done.stderr
    assert "big" in done.stderr.split("variants: ")[1]


def test_serve_takes_the_archive_and_removes_what_it_extracted(bundle_dir: Path, tmp_path: Path) -> None:
    from hmt.deploy.archive import write_archive

    archive = write_archive(bundle_dir, tmp_path / "bundle.tar.gz")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "commands.app", "serve", str(archive), "--port", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(scratch)})
    try:
        assert proc.stderr is not None
        match, seen = None, []
        for _ in range(50):
            seen.append(proc.stderr.readline())
            match = re.search(r"http://127\.0\.0\.1:(\d+)", seen[-1])
            if match or not seen[-1]:
                break
        assert match, seen
        assert any("extracted" in line for line in seen)
        assert [p.name for p in scratch.iterdir() if p.name.startswith("hmt-")]  # served from a private folder
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=5)
                conn.request("GET", "/v1/health/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert json.loads(out)["stopped"] is True
        assert [p.name for p in scratch.iterdir() if p.name.startswith("hmt-")] == []  # cleaned up on exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_energy_budget_on_relative_energies_is_refused(tmp_path: Path) -> None:
    """serve's energy budget is in mJ: on a bundle whose energies are MAC-equivalents (an uncalibrated
    profile) it is a usage error (exit 2) naming where the budget came from, never a silent relative cap."""
    from serve_bundles import make_bundle

    relative = make_bundle(tmp_path / "relative", energy_unit="mac_equivalent")
    done = subprocess.run([sys.executable, "-m", "commands.app", "serve", str(relative), "--port", "0",
                           "--set", "budgets.energy=25"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "budgets.energy (--set) = 25 mJ, but this bundle's variant energies are in mac_equivalent" in done.stderr
    assert "Traceback" not in done.stderr
    from_json = make_bundle(tmp_path / "in-json", energy_unit="mac_equivalent", serve={"budgets": {"energy": 25.0}})
    code, output = _invoke("serve", str(from_json), "--port", "0")
    assert code == 2 and "budgets.energy (bundle serve.json) = 25 mJ" in output and "uncalibrated" in output


def test_blocks_and_research_with_peer_or_adapt_are_refused_naming_the_flags(bundle_dir: Path) -> None:
    code, output = _invoke("serve", str(bundle_dir), "--blocks", "--peer", "http://127.0.0.1:9")
    assert code == 2 and "--blocks cannot be combined with --peer: offload serves cut graphs" in output
    code, output = _invoke("serve", str(bundle_dir), "--research", "--adapt")
    assert code == 2 and "--research cannot be combined with --adapt: --adapt needs" in output
    code, output = _invoke("serve", str(bundle_dir), "--blocks", "--research", "--role", "peer")
    assert code == 2 and "--blocks and --research cannot be combined with --role peer" in output


def test_options_the_role_would_ignore_are_refused(bundle_dir: Path, tmp_path: Path) -> None:
    # Before: --role peer ran with --adapt / --peer / budgets ignored, and a device given
    # --ssl-certfile served plain HTTP (its token in the clear) without a word.
    code, output = _invoke("serve", str(bundle_dir), "--role", "peer", "--adapt", "--latency-ms", "5")
    assert code == 2 and "--adapt, --latency-ms configure the device's own serving" in output
    code, output = _invoke("serve", str(bundle_dir), "--role", "peer", "--peer", "http://127.0.0.1:9")
    assert code == 2 and "--peer configure the device's own serving" in output
    pem = tmp_path / "x.pem"
    pem.write_text("-")
    code, output = _invoke("serve", str(bundle_dir), "--ssl-certfile", str(pem), "--ssl-keyfile", str(pem))
    assert code == 2 and "--ssl-certfile and --ssl-keyfile go with --role peer" in output


def test_a_scenario_that_ends_at_0_s_asks_for_a_duration(bundle_dir: Path, tmp_path: Path) -> None:
    one_row = tmp_path / "one.csv"
    one_row.write_text("time_s,cpu_load\n0,0.5\n")
    code, output = _invoke("serve", str(bundle_dir), "--scenario", str(one_row))
    assert code == 2 and f"{one_row}: its last row starts at 0 s" in output and "--duration-s" in output


def test_compare_without_clients_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    """--clients 0 sends nothing: --compare replayed every run without a request and printed a table of
    empty phases ('budgets met in 0 of 1 phases'); it is refused before serving."""
    scenario = tmp_path / "s.csv"
    scenario.write_text("time_s\n0\n2\n")
    code, output = _invoke("serve", str(bundle_dir), "--scenario", str(scenario), "--compare", "--clients", "0")
    assert code == 2 and "--compare compares the runs on the requests they answer; --clients 0 sends none" in output


def test_a_timeline_folder_that_cannot_be_made_is_refused_before_the_replay(bundle_dir: Path, tmp_path: Path) -> None:
    """--timeline-out under a file: the folder was first made when the replay (and every --compare run)
    was over, and its NotADirectoryError ended serve as an internal error (exit 70)."""
    scenario = tmp_path / "s.csv"
    scenario.write_text("time_s\n0\n30\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    started = time.monotonic()
    code, output = _invoke("serve", str(bundle_dir), "--port", "0", "--scenario", str(scenario),
                           "--timeline-out", str(blocker / "timeline"))
    assert code == 3 and f"--timeline-out {blocker / 'timeline'}: cannot create it (Not a directory)" in output
    assert time.monotonic() - started < 25  # not after the 30 s replay


def test_compare_without_a_latency_budget_says_there_were_no_deadlines(bundle_dir: Path, tmp_path: Path) -> None:
    """A scenario of memory steps alone judges no deadline: the summary lines said '0.0% missed' for
    every run, as if deadlines had been kept."""
    scenario = tmp_path / "s.csv"
    scenario.write_text("time_s,memory_budget_mb\n0,\n1,\n")
    code, output = _invoke("serve", str(bundle_dir), "--port", "0", "--scenario", str(scenario), "--compare",
                           "--rate-hz", "20", "--clients", "1")
    assert code == 0, output
    assert "adaptive: no deadlines, " in output and "done: adaptive no deadlines, oracle no deadlines" in output
    assert "0.0% missed" not in output


def test_help_names_the_settings_environment_variables() -> None:
    """The help is rendered as markdown, which took <SECTION> and <KEY> for HTML tags: it showed
    'HMT_SERVE___=VALUE', a name serve refuses."""
    code, output = _invoke("serve", "--help")
    assert code == 0 and "HMT_SERVE___" not in output
    assert "HMT_SERVE_<SECTION>__<KEY>=VALUE" in output  # the option's column may cut it short at 80 columns
