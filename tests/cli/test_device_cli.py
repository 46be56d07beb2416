"""The device command line (hmt below Python 3.10, commands.device_cli), run here on the host's Python:
what it refuses and how. A real serve on Python 3.8 is tests/runtime/test_device_python.py."""

from __future__ import annotations

import pytest

from commands.device_cli import USAGE_EXIT, main


def test_an_offline_stage_names_the_python_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-supernet", "--preset", "tiny"]) == USAGE_EXIT
    err = capsys.readouterr().err
    assert "only the device half runs: hmt serve BUNDLE" in err and "hmt train-supernet needs Python 3.10" in err
    assert main([]) == USAGE_EXIT
    assert main(["--help"]) == 0


def test_serve_errors_are_one_line_with_the_library_exit_code(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HMT_SERVE_TOKEN", raising=False)
    code = main(["serve", "no-such-bundle", "--host", "0.0.0.0", "--port", "0"])
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
