"""Fixtures for every test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """serve's roll-back state (hmt.artifacts.rollback) goes to a temporary folder, never the home
    directory of the machine running the tests; child processes inherit it through the environment."""
    state = tmp_path_factory.mktemp("hmt-state")
    monkeypatch.setenv("HMT_STATE_DIR", str(state))
    return state
