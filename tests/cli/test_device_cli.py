"""The device command line (hmt below Python 3.10, commands.device_cli), run here on the host's Python:
what it refuses and how. A real serve on Python 3.8 is tests/runtime/test_device_python.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.device_cli import USAGE_EXIT, main

REPO = Path(__file__).resolve().parents[2]


def test_an_offline_stage_names_the_python_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-supernet", "--preset", "tiny"]) == USAGE_EXIT
    err = capsys.readouterr().err
    assert "only the device half runs: hmt serve BUNDLE" in err and "hmt train-supernet needs Python 3.10" in err
    assert main([]) == USAGE_EXIT
    assert main(["--help"]) == 0


def test_serve_errors_are_one_line_with_the_library_exit_code(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HMT_SERVE_TOKEN", raising=False)
    code = main(["serve", str(tmp_path), "--host", "0.0.0.0", "--port", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --host 0.0.0.0 is not a loopback address: pass --token")
    code = main(["serve", "no-such-bundle", "--port", "0"])
    err = capsys.readouterr().err
    assert code not in (0, 1) and err.startswith("error: ") and "no-such-bundle" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as info:  # argparse: a bad number is a usage error
        main(["serve", "b", "--port", "x"])
    assert info.value.code == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("hmt ")


def test_serve_runs_an_archived_bundle_and_drains_on_sigterm(tmp_path: Path) -> None:
    """The device command line end to end (as on a JetPack 5 board, here on the host's Python): the
    bundle's .tar.gz is extracted to a private folder, requests are answered, SIGTERM exits 0."""
    import sys

    import numpy as np

    sys.path.insert(0, str(REPO / "tests" / "serve"))
    from serve_bundles import make_bundle, started_server

    from hmt.client import HmtClient
    from hmt.deploy.archive import write_archive

    archive = write_archive(make_bundle(tmp_path / "bundle"), tmp_path / "bundle.tar.gz")
    code = "import sys; from commands.device_cli import main; raise SystemExit(main(sys.argv[1:]))"
    proc, lines, url = started_server([sys.executable, "-c", code, "serve", str(archive), "--port", "0"], cwd=REPO)
    try:
        with HmtClient(url) as client:
            assert client.predict(np.zeros((1, 4), np.float32))["variant"] in {"big", "small"}
    finally:
        proc.terminate()
        exit_code = proc.wait(30)
    text = "".join(lines)
    assert exit_code == 0 and "extracted" in text and "stopped after 1 requests" in text, text
    assert "Traceback" not in text
