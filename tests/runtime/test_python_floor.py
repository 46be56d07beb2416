"""A device-only install on Python 3.8 needs no --ignore-requires-python, and the offline half and the
command line refuse Python < 3.10 with one line saying what runs there, not a SyntaxError."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]


def _python38() -> str | None:
    """A Python 3.8 that runs (a pyenv shim of a version not selected exits 127: not one)."""
    found = os.environ.get("HMT_PY38") or shutil.which("python3.8")
    if found is None:
        return None
    probe = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True,
                           timeout=60)
    return found if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)" else None


PY38 = _python38()
OFFLINE = ("hmt.supernet", "hmt.profile", "hmt.convert", "hmt.fuse", "hmt.data")


def test_requires_python_admits_the_device_python_and_every_dependency_has_a_38_choice() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert SpecifierSet(project["requires-python"]).contains("3.8.18")
    env38 = {"python_version": "3.8", "python_full_version": "3.8.18"}
    env312 = {"python_version": "3.12", "python_full_version": "3.12.1"}
    on38 = {}
    for text in project["dependencies"]:
        req = Requirement(text)
        if req.marker is None or Marker(str(req.marker)).evaluate(env38):
            on38[req.name] = req.specifier
        if req.name in ("numpy", "onnxruntime") and (req.marker is None or Marker(str(req.marker)).evaluate(env312)):
            assert req.specifier.contains("1.26.0" if req.name == "numpy" else "1.20.0"), text
    # numpy 1.24 and onnxruntime 1.19 are the newest with Python 3.8 wheels (JetPack 5).
    assert on38["numpy"].contains("1.24.4") and on38["onnxruntime"].contains("1.19.2")
    # onnxruntime 1.16 and 1.17 refuse the bundles' graphs (ai.onnx.ml opset 5): JetPack 5's pip 20.0, which
    # sees no manylinux_2_28 wheel, installed 1.16.3 and serve failed every variant.
    from hmt.runtime.ort import ORT_MIN_VERSION

    floor = ".".join(map(str, ORT_MIN_VERSION))
    assert on38["onnxruntime"].contains(f"{floor}.0") and not on38["onnxruntime"].contains("1.17.3")
    # numpy.lib.format's header readers take max_header_size from 1.24 (hmt.serve.http.inputs passes it):
    # with 1.23, which the 3.8 floor admitted, every .npy request was a 400 bad_npy.
    assert not on38["numpy"].contains("1.23.5")


@pytest.mark.parametrize(("version", "refused"), [("1.16.3", True), ("1.17.3", True), ("1.18.0", False),
                                                   ("1.19.2", False), ("1.20.0", False), ("2.0.0", False)])
def test_serve_names_an_onnxruntime_too_old_for_the_bundles(version: str, refused: bool) -> None:
    from hmt.errors import DeviceError
    from hmt.runtime.ort import check_version

    if not refused:
        check_version(version)
        return
    with pytest.raises(DeviceError, match=rf"onnxruntime {version} is installed; hmt's bundles need "
                                          r"onnxruntime >= 1\.18"):
        check_version(version)


@pytest.mark.skipif(PY38 is None, reason="no working python3.8 (set HMT_PY38)")
@pytest.mark.parametrize("package", OFFLINE)
def test_the_offline_half_refuses_python38_by_name(package: str) -> None:
    assert PY38 is not None
    done = subprocess.run([PY38, "-c", f"import {package}"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 1
    assert "ImportError: this part of hmt is the offline half" in done.stderr and "needs Python 3.10" in done.stderr
    assert "SyntaxError" not in done.stderr and "TypeError" not in done.stderr


@pytest.mark.skipif(PY38 is None, reason="no working python3.8 (set HMT_PY38)")
def test_on_python38_the_command_line_serves_and_names_what_needs_3_10() -> None:
    """Below 3.10 the console script runs the device command line (hmt serve); an offline stage is one
    line naming the Python it needs, exit 2, no traceback."""
    assert PY38 is not None
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([PY38, "-m", "commands", "serve", "--help"], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=60)
    assert done.returncode == 0 and "usage: hmt serve" in done.stdout and "--latency-ms" in done.stdout, done.stderr
    done = subprocess.run([PY38, "-m", "commands", "train-supernet", "--preset", "tiny"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("hmt: on Python 3.8") and "hmt train-supernet needs Python 3.10" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done = subprocess.run([PY38, "-m", "commands", "serve", "no-such-bundle"], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=60)
    assert done.returncode not in (0, 1) and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and "no-such-bundle" in done.stderr, done.stderr
