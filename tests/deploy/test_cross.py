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


def test_arm_bundle_with_cross_compiled_libraries_is_refused(fused_dir: Path, pareto_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle carrying aarch64 TVM libraries (built as if the device had a TVM runtime) does not
    pass verification against the real registry: its device cannot load them."""
    import dataclasses

    from hmt.deploy import targets as targets_module
    from hmt.errors import ArtifactError

    nano = targets_module.TARGETS["jetson-nano"]
    monkeypatch.setitem(targets_module.TARGETS, "jetson-nano", dataclasses.replace(nano, tvm_runtime="a TVM runtime"))
    result = deploy_bundle(fused_dir, pareto_dir, tmp_path / "nano",
                           options=DeployOptions(target="jetson-nano", engines=("onnxruntime", "tvm")))
    assert not result.failures and list((tmp_path / "nano").rglob("*.so"))
    assert verify_bundle(tmp_path / "nano", expected_target="jetson-nano", run_models=False)
    monkeypatch.setitem(targets_module.TARGETS, "jetson-nano", nano)
    with pytest.raises(ArtifactError, match="whose device cannot load it"):
        verify_bundle(result.archive or tmp_path / "nano", expected_target="jetson-nano")
    bundle = load_bundle(tmp_path / "nano")
    assert any("no GPU code" in note and "sm_53" in note for note in bundle.spec.notes)
