"""The shipped supernet works on any machine: no path of the machine it was built on, and its
INT8 copies convert without --data (the embedded CIFAR-10 test images check them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

SHIPPED = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"
ABSOLUTE = re.compile(r'"(/(tmp|home|root|work|mnt|Users|var)/[^"]*)"')


def test_shipped_supernet_names_no_machine_path() -> None:
    for path in sorted(SHIPPED.glob("*.json")):
        found = ABSOLUTE.findall(path.read_text())
        assert not found, f"{path.name} records a machine path: {found[0][0]}"
    config = json.loads((SHIPPED / "manifest.json").read_text())["config"]
    assert config["data_path"] is None


@pytest.mark.slow
def test_shipped_supernet_int8_converts_without_data(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = SHIPPED.parents[3]
    out = tmp_path / "converted"
    env = {**os.environ, "PYTHONPATH": str(root)}
    # 200 images give the INT8 check a granularity of 0.5 points: this test is about needing no --data,
    # the accuracy bound has its own tests.
    command = [sys.executable, "-m", "commands", "convert", "--supernet", str(SHIPPED), "--variant", "largest.int8",
               "--accuracy-samples", "200", "--max-accuracy-drop", "5", "--out", str(out), "--json"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = (out / "report.json").read_text()
    assert "test split of the embedded CIFAR-10 subset" in report
