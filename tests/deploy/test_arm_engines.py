"""Arm targets have no TVM runtime to install: deploy leaves TVM out, refuses --engine tvm,
and a bundle that holds a library its device cannot load is refused when it is checked."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hmt.bundle import check_bundle, load_bundle
from hmt.deploy import DeployOptions, deploy_bundle
from hmt.deploy import targets as targets_module
from hmt.errors import ArtifactError, UsageError


@pytest.mark.parametrize("name", ["raspberry-pi-4b", "jetson-nano"])
def test_default_arm_bundle_leaves_tvm_out_and_says_so(fused_dir: Path, pareto_dir: Path, tmp_path: Path,
                                                      name: str) -> None:
    result = deploy_bundle(fused_dir, pareto_dir, tmp_path / name, options=DeployOptions(target=name, archive=False))
    assert all(v.engines == ("onnxruntime",) for v in result.variants)
    assert not list((tmp_path / name).rglob("*.so"))
    bundle = load_bundle(tmp_path / name)
    assert any(note.startswith(f"TVM left out for {name}") and "apache-tvm-ffi" in note for note in bundle.spec.notes)
    assert check_bundle(bundle).libraries == 0


def test_engine_tvm_for_an_arm_target_is_refused_before_any_work(fused_dir: Path, pareto_dir: Path,
                                                                 tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--engine tvm: target raspberry-pi-4b cannot load TVM libraries"):
        deploy_bundle(fused_dir, pareto_dir, tmp_path / "b",
                      options=DeployOptions(target="raspberry-pi-4b", engines=("onnxruntime", "tvm")))
    assert not (tmp_path / "b").exists()


def test_bundle_with_a_library_its_device_cannot_load_is_refused(bundle_copy: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = load_bundle(bundle_copy)
    assert check_bundle(bundle).libraries > 0  # the x86-64 bundle carries TVM libraries its host can load
    # The same bundle, were its target's device to have no TVM runtime, holds libraries it cannot load.
    x86 = targets_module.TARGETS["x86-64"]
    monkeypatch.setitem(targets_module.TARGETS, "x86-64",
                        dataclasses.replace(x86, tvm_runtime=None, no_tvm_reason="no runtime (test)"))
    with pytest.raises(ArtifactError, match=r"\.so: a TVM library in a bundle for x86-64, whose device cannot load"):
        check_bundle(bundle)


def test_an_arm_bundle_served_on_another_machine_says_whose_numbers_it_carries(
        fused_dir: Path, pareto_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An Arm bundle serves on x86 (its ONNX graphs are portable): serve says so at start instead of
    serving silently on the board's profile, threads and predictions."""
    from commands._output import Output
    from commands.serve_offload import note_listening
    from hmt.bundle import foreign_machine_note

    out = tmp_path / "rpi"
    deploy_bundle(fused_dir, pareto_dir, out, options=DeployOptions(target="raspberry-pi-4b", archive=False))
    bundle = load_bundle(out)
    note = foreign_machine_note(bundle, "x86_64")
    assert note is not None
    assert note.startswith(f"{out} was built for raspberry-pi-4b (aarch64) and this machine is x86_64: ")
    assert "raspberry-pi-4b's, not this machine's" in note
    assert foreign_machine_note(bundle, "aarch64") is None and foreign_machine_note(bundle, "arm64") is None
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    note_listening(Output(), out, "serving it")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "serving it" and printed[1] == f"note: {note}" and len(printed) == 2


def test_a_bundle_for_this_machine_gets_no_note(x86_bundle: Path) -> None:
    from hmt.bundle import foreign_machine_note

    bundle = load_bundle(x86_bundle)
    assert foreign_machine_note(bundle, "x86_64") is None and foreign_machine_note(bundle, "AMD64") is None
    assert foreign_machine_note(bundle, "aarch64") is not None


def test_every_target_states_the_python_floor_and_only_jetsons_the_jetpack_advice() -> None:
    from hmt.deploy.targets import TARGETS

    for name, target in TARGETS.items():
        notes = " ".join(target.notes)
        assert "Python 3.8" in notes, name
        assert ("JetPack 4" in notes) == name.startswith("jetson"), name
