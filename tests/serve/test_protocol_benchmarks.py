"""The protocol benchmarks' --quick paths run end to end and write a result with the convention's keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

KEYS = {"area", "name", "command", "date", "revision", "machine", "seed", "baseline", "results", "claims"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["latency", "batching", "scrape"])
def test_quick_run_writes_a_result(name: str) -> None:
    pytest.importorskip("tritonclient.http")
    import importlib

    driver = importlib.import_module(f"benchmarks.protocol.{name}")
    path = driver.run(["--quick"])
    doc = json.loads(Path(path).read_text())
    assert set(doc) >= KEYS and doc["area"] == "protocol" and doc["name"] == name and doc["claims"]
    assert "benchmarks/protocol/results" not in str(path)  # quick runs stay out of the repo
