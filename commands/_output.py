"""One output object per invocation: human (rich), --json (one document on stdout) or quiet.

In --json mode nothing but the final JSON document goes to stdout; progress and notes go
to stderr so that CI scripts can pipe stdout straight into ``jq``. A command that fails
prints, in place of its result, ``{"error": {"message", "exit_code", "type"}}`` there (the
message goes to stderr as well), so stdout always holds exactly one document.

Text is printed as given: rich markup is never interpreted in messages, table cells or
progress labels (a path or hint holding ``[offline]`` or ``[/b]`` prints verbatim); styles
are applied with :func:`styled` instead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from hmt.progress import ProgressCallback


def styled(label: str, style: str, message: str) -> Text:
    """``label`` in ``style``, a space, then ``message`` exactly as given (no markup)."""
    return Text.assemble((label, style), " ", message)


def verbatim(value: Any) -> Text:
    """A value printed verbatim, brackets included."""
    return Text(str(value))


class Output:
    def __init__(self, *, json_mode: bool = False, quiet: bool = False) -> None:
        self.json_mode = json_mode
        self.quiet = quiet
        self.result_written = False
        self.stdout = sys.stdout  # the document's stream, kept while --json sends other prints to stderr
        self.out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.err = Console(file=sys.stderr, highlight=False, soft_wrap=True)

    def note(self, message: str) -> None:
        """A line of human information (stderr in --json mode)."""
        if self.quiet:
            return
        (self.err if self.json_mode else self.out).print(verbatim(message))

    def warn(self, message: str) -> None:
        self.err.print(styled("warning:", "yellow", message))

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.quiet or self.json_mode:
            return
        table = Table(title=verbatim(title))
        for column in columns:
            table.add_column(verbatim(column), overflow="fold")
        for row in rows:
            table.add_row(*[verbatim(_fmt(cell)) for cell in row])
        self.out.print(table)

    def result(self, document: dict[str, Any], human: str | None = None) -> None:
        """The command's final result: the JSON document, or a human line."""
        if self.json_mode:
            write_json_document(document, self.stdout)
            self.result_written = True
        elif human and not self.quiet:
            self.out.print(verbatim(human))

    def error(self, message: str, exit_code: int, error_type: str) -> None:
        """In --json mode, the error document in place of a result not yet written (the
        human message is printed to stderr by the caller)."""
        if self.json_mode and not self.result_written:
            write_json_document(error_document(message, exit_code, error_type), self.stdout)
            self.result_written = True

    @contextmanager
    def progress(self) -> Iterator[ProgressCallback]:
        """A callback the library reports progress to; a rich bar on a TTY, plain lines otherwise."""
        console = self.err
        if self.quiet:
            yield lambda task, done, total, info=None: None
            return
        if not console.is_terminal:
            last: dict[str, int] = {}

            def plain(task: str, done: int, total: int | None, info: str | None = None) -> None:
                # Plain output: one line per ~10% so CI logs stay readable.
                step = max(1, (total or 10) // 10)
                if done == total or done - last.get(task, -step) >= step:
                    last[task] = done
                    suffix = f" {info}" if info else ""
                    console.print(verbatim(f"{task}: {done}/{total if total else '?'}{suffix}"))

            yield plain
            return
        bars = Progress(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}", markup=False),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        ids: dict[str, Any] = {}

        def rich_cb(task: str, done: int, total: int | None, info: str | None = None) -> None:
            if task not in ids:
                ids[task] = bars.add_task(task, total=total, info=info or "")
            bars.update(ids[task], completed=done, total=total, info=info or "")

        with bars:
            yield rich_cb


def error_document(message: str, exit_code: int, error_type: str) -> dict[str, Any]:
    """What --json prints on stdout when a command fails."""
    return {"error": {"exit_code": exit_code, "message": message, "type": error_type}}


def write_json_document(document: dict[str, Any], stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    stream.flush()


def _fmt(cell: Any) -> str:
    if isinstance(cell, float):
        return f"{cell:.4g}"
    return str(cell)
