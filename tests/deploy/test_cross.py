"""Cross-compilation for the Arm targets (needs Debian's gcc-aarch64-linux-gnu: slow, skipped without it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hmt.bundle import load_bundle
from hmt.deploy import DeployOptions, deploy_bundle, verify_bundle
from hmt.deploy.compile import compile_graph
from hmt.deploy.elf import read_elf_header
from hmt.deploy.targets import get_target

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                       reason="aarch64-linux-gnu-gcc not found: apt-get install -y gcc-aarch64-linux-gnu "
                              "(scripts/setup.sh does it where apt works)"),
]


def test_cross_compiled_library_is_aarch64(fused_dir: Path, tmp_path: Path) -> None:
    graph = next(fused_dir.rglob("segment_0.onnx"))
    out = tmp_path / "segment_0.so"
    compile_s = compile_graph(graph, get_target("raspberry-pi-4b"), out)
    header = read_elf_header(out)
    assert (header.machine, header.bits, header.little_endian) == ("aarch64", 64, True)
    assert compile_s > 0


def test_jetson_bundle_verifies_by_elf_header(fused_dir: Path, pareto_dir: Path, tmp_path: Path) -> None:
    result = deploy_bundle(fused_dir, pareto_dir, tmp_path / "nano", options=DeployOptions(target="jetson-nano"))
    assert not result.failures
    bundle = load_bundle(tmp_path / "nano")
    assert any("no GPU code" in note and "sm_53" in note for note in bundle.spec.notes)
    report = verify_bundle(result.archive or tmp_path / "nano", expected_target="jetson-nano")
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["elf machine"] == "ok"
    assert [s for name, s in statuses.items() if name.endswith("[tvm]")] == ["skipped"]  # not loadable on x86
    assert all(s == "ok" for name, s in statuses.items() if name.endswith("[onnxruntime]"))
