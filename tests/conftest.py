"""Fixtures for every test."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """serve's roll-back state (hmt.artifacts.rollback) goes to a temporary folder, never the home
    directory of the machine running the tests; child processes inherit it through the environment."""
    state = tmp_path_factory.mktemp("hmt-state")
    monkeypatch.setenv("HMT_STATE_DIR", str(state))
    return state


@pytest.fixture(autouse=True)
def _logging_kept() -> Iterator[None]:
    """A test that runs serve's command line in process applies serve's logging config (the hmt and
    uvicorn loggers stop propagating, to serve's own handler); later tests reading log records through
    caplog then saw none. Each test leaves these loggers as it found them."""
    names = ("hmt", "uvicorn", "uvicorn.error", "uvicorn.access")
    kept = {n: (logging.getLogger(n).level, logging.getLogger(n).propagate, list(logging.getLogger(n).handlers),
                logging.getLogger(n).disabled) for n in names}
    yield
    for name, (level, propagate, handlers, disabled) in kept.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate, logger.handlers, logger.disabled = propagate, handlers, disabled
