"""Bundles end to end on tiny artifacts: build for x86-64, load, verify, tamper, bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import commands.deploy  # noqa: F401 - registers the command
from commands.app import app
from hmt.artifacts import ArtifactWriter, ParentRecord, load_artifact
from hmt.artifacts.manifest import content_digest
from hmt.bundle import load_bundle
from hmt.deploy import DeployOptions, deploy_bundle, verify_bundle
from hmt.deploy.archive import archive_path_for
from hmt.deploy.sources import check_lineage
from hmt.errors import ArtifactError, InputError, ModelError, UsageError
from hmt.pareto.index import load_index
from hmt.runtime.settings import ServeSettings

runner = CliRunner()


def test_x86_bundle_round_trip(x86_bundle: Path, variant_id: str) -> None:
    bundle = load_bundle(x86_bundle)
    assert bundle.spec.target["name"] == "x86-64"
    (variant,) = bundle.spec.variants  # only the fused variant, not the other front point
    assert variant.arch_id == variant_id and set(variant.engines) == {"onnxruntime", "tvm"}
    assert len(variant.segments) == 2 and all(g.tvm for g in variant.graphs())
    assert (variant.accuracy, variant.exit_stage, variant.accuracy_per_exit) == (0.6, 1, (0.4, 0.6))
    assert [e.arch_id for e in load_index(bundle.index_path()).entries] == [variant_id]
    settings = ServeSettings.from_mapping(bundle.serve_config)
    assert (settings.budgets.latency_ms, settings.budgets.memory_mb) == (5.0, 64.0)
    assert bundle.profile()["facts"]["arch"] == "x86_64"
    manifest = bundle.artifact.manifest
    assert manifest.config["target"] == "x86-64" and manifest.environment["packages"]["apache-tvm"]
    assert {p.kind for p in manifest.parents} == {"fused", "pareto"}
    assert archive_path_for(x86_bundle).is_file()
    report = verify_bundle(archive_path_for(x86_bundle), expected_target="x86-64")
    statuses = {c.name: c.status for c in report.checks}
    assert statuses[f"run {variant_id} [tvm]"] == "ok" and statuses["elf machine"] == "ok"


def test_flipped_byte_is_caught(bundle_copy: Path) -> None:
    library = next(bundle_copy.rglob("*.so"))
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0x01
    library.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"{library.name}: sha256 mismatch"):
        verify_bundle(bundle_copy)


def test_extra_file_is_caught(bundle_copy: Path) -> None:
    (bundle_copy / "variants" / "payload.sh").write_text("echo hi\n")
    with pytest.raises(ArtifactError, match=r"not in manifest.json: variants/payload.sh"):
        verify_bundle(bundle_copy)


def test_a_blocks_spec_serve_cannot_read_fails_verify(bundle_copy: Path) -> None:
    """verify said 'bundle OK' for a deploy --blocks bundle whose blocks/blocks.json does not parse (its
    checksum resealed): serve --blocks then refused it on the device."""
    import hashlib
    import json

    spec = bundle_copy / "blocks" / "blocks.json"
    spec.parent.mkdir()
    spec.write_text("[" * 100_000 + "]" * 100_000)
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["files"].append({"path": "blocks/blocks.json", "sha256": hashlib.sha256(spec.read_bytes()).hexdigest(),
                              "size_bytes": spec.stat().st_size, "media_type": "application/json"})
    manifest["content_sha256"] = content_digest(manifest)
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"blocks/blocks.json: not valid JSON \(nested too deeply\)"):
        verify_bundle(bundle_copy, run_models=False)


def test_tampered_archive_through_the_cli(bundle_copy: Path, tmp_path: Path) -> None:
    from hmt.deploy.archive import write_archive

    spec = bundle_copy / "bundle.json"
    spec.write_text(spec.read_text().replace('"accuracy": 0.6', '"accuracy": 0.9'))
    archive = write_archive(bundle_copy, tmp_path / "tampered.tar.gz")
    result = runner.invoke(app, ["deploy", "--verify", str(archive)])
    assert result.exit_code == ArtifactError.exit_code
    assert "bundle.json: sha256 mismatch" in result.output and str(archive) in result.output
    assert "Traceback" not in result.output and "hmt-verify-" not in result.output


def test_wrong_target_is_refused(x86_bundle: Path) -> None:
    with pytest.raises(ArtifactError, match="built for target 'x86-64', expected 'raspberry-pi-4b'"):
        verify_bundle(x86_bundle, expected_target="raspberry-pi-4b", run_models=False)


def test_variant_missing_from_the_front(fused_dir: Path, tmp_path: Path, pareto_maker: Any) -> None:
    pareto = pareto_maker(tmp_path / "pareto", ["someone-else.e1.abc"])
    with pytest.raises(InputError, match=r"not on the pareto front.*hmt convert --supernet .* --pareto"):
        deploy_bundle(fused_dir, pareto, tmp_path / "b", options=DeployOptions(target="x86-64"))
    assert not (tmp_path / "b").exists()


def test_unknown_variant_and_options(fused_dir: Path, pareto_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not in the fused artifact"):
        deploy_bundle(fused_dir, pareto_dir, tmp_path / "b", options=DeployOptions(target="x86-64", variants=("x",)))
    with pytest.raises(UsageError, match="exceeds jetson-nano's memory"):
        deploy_bundle(fused_dir, pareto_dir, tmp_path / "b",
                      options=DeployOptions(target="jetson-nano", memory_mb=10_000, engines=("onnxruntime",)))
    with pytest.raises(UsageError, match="budgets.latency_ms"):
        deploy_bundle(fused_dir, pareto_dir, tmp_path / "b", options=DeployOptions(target="x86-64", latency_ms=-1))


def _failing_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(onnx_path: Path, target: object, out_path: Path) -> float:
        if onnx_path.name == "segment_1.onnx":
            raise ModelError(f"{onnx_path.name}: TVM's ONNX frontend cannot import the model: op Foo")
        out_path.write_bytes(b"\x7fELF")
        return 0.0

    monkeypatch.setattr("hmt.deploy.compile.compile_graph", fail)


def test_compile_failure_falls_back_to_onnxruntime(fused_dir: Path, pareto_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, variant_id: str) -> None:
    _failing_compile(monkeypatch)
    result = deploy_bundle(fused_dir, pareto_dir, tmp_path / "b", options=DeployOptions(target="x86-64"))
    assert result.failures == {variant_id: "segment_1.onnx: TVM's ONNX frontend cannot import the model: op Foo"}
    (variant,) = load_bundle(tmp_path / "b").spec.variants
    assert variant.engines == ("onnxruntime",) and not list((tmp_path / "b").rglob("*.so"))
    assert any("bundled for ONNX Runtime only" in n for n in load_bundle(tmp_path / "b").spec.notes)


def test_compile_failure_with_strict_fails_the_bundle(fused_dir: Path, pareto_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_compile(monkeypatch)
    result = runner.invoke(app, ["deploy", "--fused", str(fused_dir), "--pareto", str(pareto_dir), "--target",
                                 "x86-64", "--strict", "--out", str(tmp_path / "b")])
    assert result.exit_code == ModelError.exit_code, result.output
    assert "does not compile for x86-64 (--strict)" in result.output and "op Foo" in result.output
    assert not (tmp_path / "b").exists() and "Traceback" not in result.output


def test_cli_build_onnx_only_json(fused_dir: Path, pareto_dir: Path, tmp_path: Path, variant_id: str) -> None:
    out = tmp_path / "rpi"
    result = runner.invoke(app, ["deploy", "--fused", str(fused_dir), "--pareto", str(pareto_dir), "--target",
                                 "raspberry-pi-4b", "--engine", "onnxruntime", "--variant", variant_id,
                                 "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["target"] == "raspberry-pi-4b" and doc["verify"]["ok"]
    assert doc["size_bytes"] > 0 and doc["archive_size_bytes"] > 0
    assert any("not for the bundled profile cortexA72" in n for n in doc["notes"])


def _artifact(path: Path, kind: str, parents: list[ParentRecord]) -> Path:
    with ArtifactWriter(path, kind=kind, config={}, parents=parents) as writer:
        writer.write_json("x.json", {})
    return path


def test_lineage_mismatch_is_refused(tmp_path: Path) -> None:
    supernet_a = ParentRecord("supernet", "/runs/a", "a" * 64)
    supernet_b = ParentRecord("supernet", "/runs/b", "b" * 64)
    converted = load_artifact(_artifact(tmp_path / "converted", "converted", [supernet_a]), kind="converted")
    fused = load_artifact(_artifact(tmp_path / "fused", "fused", [converted.as_parent()]), kind="fused")
    same = load_artifact(_artifact(tmp_path / "p1", "pareto", [supernet_a]), kind="pareto")
    other = load_artifact(_artifact(tmp_path / "p2", "pareto", [supernet_b]), kind="pareto")
    assert check_lineage(fused, same).startswith("checked")
    with pytest.raises(InputError, match="lineage mismatch"):
        check_lineage(fused, other)
    shutil.rmtree(tmp_path / "converted")
    assert check_lineage(fused, other).startswith("not checked")


def test_deploy_energy_budget_reaches_the_decision(fused_dir: Path, pareto_dir: Path, tmp_path: Path) -> None:
    """``deploy --energy`` lands in serve.json's one budget type and serve decides within it (issue 14
    item 4): the only variant costs 100 (the front's energy), so a budget of 50 leaves nothing feasible."""
    import time

    from hmt.serve.controller import Controller
    from hmt.serve.deciding.monitor import ResourceSample

    def sample() -> ResourceSample:
        return ResourceSample(time.monotonic(), 0.0, 8_000_000_000, 8_000_000_000)

    verdicts = {}
    for energy in (50.0, 200.0):
        out = tmp_path / f"b{energy:g}"
        deploy_bundle(fused_dir, pareto_dir, out, options=DeployOptions(target="x86-64", engines=("onnxruntime",),
                                                                         energy=energy, archive=False))
        bundle = load_bundle(out)
        assert ServeSettings.from_mapping(bundle.serve_config).budgets.energy == energy
        c = Controller(bundle, sampler=sample, warmup_runs=1)
        c.start(background=False)
        record = c.tick(sample=sample())
        assert record.energy_budget == energy and c.status()["energy_budget"] == energy
        verdicts[energy] = record.feasible
    assert verdicts == {50.0: False, 200.0: True}


def test_deploy_refuses_an_energy_budget_on_relative_energies(fused_dir: Path, variant_id: str,
                                                              tmp_path: Path) -> None:
    """An energy budget is in mJ: a front from an uncalibrated profile (MAC-equivalents) cannot hold it."""
    from tests.deploy.conftest import make_pareto, point

    relative = make_pareto(tmp_path / "pareto", [point(variant_id)], energy_unit="mac_equivalent")
    with pytest.raises(UsageError, match=r"--energy-mj 50: the front's energies are in mac_equivalent.*calibrated"):
        deploy_bundle(fused_dir, relative, tmp_path / "b", options=DeployOptions(
            target="x86-64", engines=("onnxruntime",), energy=50.0, archive=False))
    assert not (tmp_path / "b").exists()
    deploy_bundle(fused_dir, relative, tmp_path / "free", options=DeployOptions(
        target="x86-64", engines=("onnxruntime",), archive=False))  # no energy budget: deployed
    assert load_bundle(tmp_path / "free").energy_unit() == "mac_equivalent"
