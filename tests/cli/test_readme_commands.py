"""The README's ``hmt ...`` examples, ``--help`` and the preset registry agree.

Every ``hmt`` command in the README's shell code blocks is parsed by the real command line
(click, as typer builds it) without running it: an unknown subcommand or option, a missing
value, an extra argument or a value of the wrong type fails here. Values that only a real
run can check (a path that exists on the user's machine) are left to the run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer import Context
from typer._click import exceptions as cli_errors  # click's exceptions, as typer vendors them

from commands.app import _register, app
from hmt.supernet.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDERS = {"...", "|"}


def readme_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, argv after ``hmt``) of every hmt command in the shell code blocks."""
    found: list[tuple[int, list[str]]] = []
    for block in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        if block.group(1) not in ("", "bash", "sh") or not re.search(r"^hmt |&& hmt ", block.group(2), re.M):
            continue
        first_line = text.count("\n", 0, block.start(2)) + 1
        logical, start = "", first_line
        for offset, line in enumerate(block.group(2).splitlines()):
            if not logical:
                start = first_line + offset
            if line.rstrip().endswith("\\"):
                logical += line.rstrip()[:-1] + " "
                continue
            logical += line
            tokens = shlex.split(logical, comments=True)
            logical = ""
            segment: list[str] = []
            for token in [*tokens, "&&"]:
                if token in ("&&", ";", "||"):
                    if segment and segment[0] == "hmt":
                        found.append((start, _fill(segment[1:])))
                    segment = []
                else:
                    segment.append(token)
    return found


def _fill(tokens: list[str]) -> list[str]:
    """``...`` after an option stands for its value (a placeholder); elsewhere, like ``|``, it is prose."""
    out: list[str] = []
    for token in tokens:
        if token in PLACEHOLDERS:
            if token == "..." and out and out[-1].startswith("--") and "=" not in out[-1]:
                out.append("VALUE")
            continue
        out.append(token)
    return out


def _root() -> Any:
    _register()
    return typer.main.get_command(app)


def check_parses(root: Any, argv: list[str]) -> None:
    """Parse ``argv`` as the CLI would, without invoking the command."""
    if not argv or argv[0].startswith("-"):
        root.make_context("hmt", list(argv), resilient_parsing=True)
        return
    name, *rest = argv
    command = root.get_command(Context(root), name)
    if command is None:
        raise cli_errors.UsageError(f"no such command {name!r}")
    if "--help" in rest:
        return
    try:
        command.make_context(name, list(rest))
    except cli_errors.BadParameter as exc:
        if exc.param is None or isinstance(exc, cli_errors.MissingParameter):
            raise
        # the value itself: only a run on the user's machine can check it (a path that exists)
        command.make_context(name, list(rest), resilient_parsing=True)


README_COMMANDS = readme_commands((REPO / "README.md").read_text())


def test_the_readme_has_hmt_examples() -> None:
    assert len(README_COMMANDS) >= 20
    assert {argv[0] for _, argv in README_COMMANDS if argv and not argv[0].startswith("-")} >= {
        "train-supernet", "profile-device", "pareto", "convert", "fuse", "deploy", "serve", "adapt"}


@pytest.mark.parametrize(("line", "argv"), README_COMMANDS, ids=[f"README.md:{n}" for n, _ in README_COMMANDS])
def test_readme_command_parses(line: int, argv: list[str]) -> None:
    try:
        check_parses(_root(), argv)
    except cli_errors.ClickException as exc:
        pytest.fail(f"README.md:{line}: hmt {shlex.join(argv)}: {exc.format_message()}")


def test_a_wrong_option_or_extra_argument_is_caught() -> None:
    root = _root()
    with pytest.raises(cli_errors.NoSuchOption):
        check_parses(root, ["train-supernet", "--presett", "tiny"])
    with pytest.raises(cli_errors.UsageError, match="unexpected extra argument"):
        check_parses(root, ["fuse", "runs/converted", "extra", "--out", "runs/fused"])
    with pytest.raises(cli_errors.UsageError):
        check_parses(root, ["no-such-stage"])


def test_readme_presets_exist_and_help_lists_the_registry() -> None:
    used = {argv[argv.index("--preset") + 1] for _, argv in README_COMMANDS if "--preset" in argv}
    assert used and used <= set(PRESETS), f"README presets not in the registry: {used - set(PRESETS)}"
    result = subprocess.run([sys.executable, "-m", "commands.app", "train-supernet", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="400"))
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    assert f"Start from a preset: {', '.join(PRESETS)}." in help_text
