"""Option values torch, the search or adaptation cannot use are refused before any work (exit 2), naming the flag.

Before, ``--device gpu9`` reached torch after the data and the supernet were loaded (a bare
RuntimeError or SafetensorError, exit 70), and ``pareto --greedy-drop nan`` / ``--cache-mb nan``
passed their ``< 0`` checks and failed as internal errors, the first one only after the whole search.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    from commands.app import _register, app

    _register()
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _pareto(tmp_path: Path, *extra: str) -> list[str]:
    return ["pareto", "--supernet", str(tmp_path / "sn"), "--profile", str(tmp_path / "p.json"), "--out",
            str(tmp_path / "out"), *extra]


@pytest.mark.parametrize(("args", "words"), [
    (("--device", "gpu9"), "--device 'gpu9': expected cpu, cuda or cuda:N"),
    (("--device", ""), "--device '': expected"),
    (("--greedy-drop", "nan"), "--greedy-drop must be >= 0"),
    (("--cache-mb", "nan"), "feature cache must be a finite number"),
    (("--cache-mb", "inf"), "feature cache must be a finite number"),
])
def test_pareto_refuses_before_loading(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    code, output = invoke(*_pareto(tmp_path, *args))  # the supernet does not even exist
    assert code == 2 and words in output, output


@pytest.mark.parametrize("command", [["train-supernet", "--preset", "tiny"],
                                     ["specialize", "--supernet", "nowhere", "--variants", "e1.B"]])
def test_training_commands_refuse_an_unknown_device(tmp_path: Path, command: list[str]) -> None:
    code, output = invoke(*command, "--device", "gpu9", "--out", str(tmp_path / "out"))
    assert code == 2 and "--device 'gpu9': expected auto, cpu, cuda or cuda:N" in output, output
    assert not (tmp_path / "out").exists()


def test_cuda_without_cuda_is_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, output = invoke(*_pareto(tmp_path, "--device", "cuda"))
    assert code == 2 and "CUDA is not available here" in output, output


@pytest.mark.parametrize(("args", "words"), [
    (("--threads", "0"), "--threads must be >= 1, got 0"),  # torch.set_num_threads: RuntimeError, exit 70
    (("--limit", "0"), "--limit must be >= 1 images per set"),  # IndexError after loading, exit 70
    (("--limit", "-1"), "--limit must be >= 1 images per set"),  # taken silently
    (("--memory-budget-mb", "nan"), "--memory-budget-mb must be a finite number > 0"),  # int(nan): exit 70
])
def test_adapt_refuses_before_loading(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    code, output = invoke("adapt", str(tmp_path / "nowhere"), "--data", str(tmp_path / "data"), "--out",
                          str(tmp_path / "out"), *args)
    assert code == 2 and words in output, output
