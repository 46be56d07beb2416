"""The progress protocol library code reports to; the CLI decides how to show it."""

from __future__ import annotations

from typing import Protocol


class ProgressCallback(Protocol):
    def __call__(self, task: str, done: int, total: int | None, info: str | None = None) -> None: ...


def no_progress(task: str, done: int, total: int | None, info: str | None = None) -> None:
    """The default callback: report nothing."""
