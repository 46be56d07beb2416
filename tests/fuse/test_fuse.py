"""fuse end to end on a tiny converted artifact: passes, plan, engines, choice, manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hmt.artifacts import load_artifact
from hmt.errors import ArtifactError, UsageError
from hmt.fuse import FuseOptions, fuse_model


def test_fuse_with_ort_only(converted_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused"
    result = fuse_model(converted_dir, out, options=FuseOptions(engines=("ort",), repeats=5, warmup=1))
    artifact = load_artifact(out, kind="fused")
    assert artifact.manifest.parents[0].kind == "converted"
    (variant,) = result.variants
    assert variant.engine in result.report["variants"][0]["candidates"]
    assert not any("(chain)" in label for label in result.report["variants"][0]["candidates"])  # one graph
    report = json.loads((out / "report.json").read_text())
    graph = report["variants"][0]["graphs"][0]
    assert {p["name"] for p in graph["passes"]} == {"linear", "conv-batchnorm", "element-wise", "channel-wise",
                                                     "reduction"}
    assert graph["passes"][-1]["name"] == "reduction" and graph["passes"][-1]["fired"] == 1
    plan = graph["memory_plan"]
    assert plan["lower_bound_bytes"] <= plan["planned_peak_bytes"] <= plan["naive_bytes"]
    saved = onnx.load(str(out / graph["onnx"]["file"]))
    assert all(n.domain in ("", "ai.onnx") for n in saved.graph.node)  # portable
    onnx.checker.check_model(saved, full_check=True)
    timings = artifact.manifest.metrics["per_variant"]["model"]
    assert timings["latency_ms"] > 0 and timings["ort_default_ms"] > 0
    # The saved graph computes the same thing as the converted one.
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    ref = ort.InferenceSession(str(converted_dir / "model" / "model.onnx")).run(None, {"input": x})[0]
    got = ort.InferenceSession(str(out / graph["onnx"]["file"])).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-4)


def test_fuse_with_tvm_compiles_and_verifies(converted_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused"
    result = fuse_model(converted_dir, out, options=FuseOptions(engines=("ort", "tvm"), repeats=3, warmup=1))
    report = result.report["variants"][0]
    tvm = report["candidates"]["tvm"]
    assert tvm["verification"]["passed"], tvm
    assert tvm["target"]["kind"] == "llvm" and tvm["target"]["mcpu"]
    assert (out / tvm["libraries"]["model/model.onnx"]).is_file()
    assert report["choice"]["candidate"] in report["candidates"]


def test_tvm_only_fuse_is_deployable(segmented_dir: Path, tmp_path: Path) -> None:
    """`hmt fuse --engine tvm` still writes every graph's fused ONNX: deploy bundles ONNX Runtime
    for every variant, and refused such an artifact ('fuse ran without the ort engine')."""
    from hmt.deploy.sources import read_fused_variants

    out = tmp_path / "fused"
    result = fuse_model(segmented_dir, out, options=FuseOptions(engines=("tvm",), repeats=2, warmup=1))
    report = result.report["variants"][0]
    assert "tvm" in report["candidates"]
    assert not any(label.startswith("ort[") for label in report["candidates"])  # no ORT candidates timed
    for graph in report["graphs"]:
        assert (out / graph["onnx"]["file"]).is_file()
    (variant,) = read_fused_variants(load_artifact(out, kind="fused"))
    assert [g.onnx for g in variant.segments] == ["model/segment_0.onnx", "model/segment_1.onnx"]


def test_bad_options_and_inputs(converted_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown graph pass"):
        fuse_model(converted_dir, tmp_path / "o", options=FuseOptions(passes=("nope",)))
    with pytest.raises(UsageError, match="tvm"):
        fuse_model(converted_dir, tmp_path / "o", options=FuseOptions(engines=("ort",), tune_trials=5))
    with pytest.raises(ArtifactError):
        fuse_model(tmp_path, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_segmented_variant_is_timed_as_a_chain(segmented_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused"
    result = fuse_model(segmented_dir, out, options=FuseOptions(engines=("ort",), repeats=3, warmup=1))
    report = result.report["variants"][0]
    assert report["timed_path"] == ["model/segment_0.onnx", "model/segment_1.onnx", "model/exit_1.onnx"]
    assert len(report["graphs"]) == 4
    assert all(c["verification"]["passed"] for c in report["candidates"].values())
    for graph in report["graphs"]:
        assert (out / graph["onnx"]["file"]).is_file() and (out / graph["memory_plan_file"]).is_file()
    # The timed path merged into one graph is a candidate too (one ORT call per inference).
    merged = report["candidates"]["ort[all,threads=default](chain)"]
    assert merged["graphs"] == "chain" and merged["chain"] == report["timed_path"]
    assert merged["verification"]["passed"] and "ort[all,threads=1](chain)" in report["candidates"]
    saved = onnx.load(str(out / merged["onnx"]))
    assert [i.name for i in saved.graph.input] == ["input"] and len(saved.graph.output) == 1
    assert all(n.domain in ("", "ai.onnx") for n in saved.graph.node)
    timing = load_artifact(out, kind="fused").manifest.config["timing"]
    assert timing["mode"] == "rounds" and timing["burst"] == 20 and timing["dropped_per_burst"] == 4
    assert timing["rounds"] == 3 and len(merged["timing"]["round_medians_ms"]) == 3
    assert result.report["timing"]["burst"] == 20 and "cold_median_ms" in merged["timing"]
    # The report says how far each other candidate was from the choice, and whether it tied.
    against = report["choice"]["against_others"]
    assert set(against) == set(report["candidates"]) - {report["choice"]["candidate"]}
    assert all({"median_ratio_to_choice", "tie_threshold", "tied"} <= set(v) for v in against.values())
    assert report["candidates"][report["choice_per_graph"]["candidate"]].get("graphs") != "chain"


def test_load_fused_runner_reproduces_the_choice(segmented_dir: Path, tmp_path: Path) -> None:
    from hmt.fuse.runtime import load_fused_runner

    out = tmp_path / "fused"
    result = fuse_model(segmented_dir, out, options=FuseOptions(engines=("ort",), repeats=2, warmup=1))
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    outputs = {}
    for label in result.report["variants"][0]["candidates"]:
        outputs[label] = load_fused_runner(out, "model", {"input": x}, candidate=label)()[0]
    chosen = load_fused_runner(out, "model", {"input": x})()[0]
    for value in outputs.values():
        np.testing.assert_allclose(value, chosen, atol=1e-5, rtol=1e-4)
    assert chosen.shape == (1, 4)


def test_choice_needs_a_clear_win_to_leave_ort_defaults() -> None:
    from hmt.fuse.choice import BASELINE, choose
    from hmt.fuse.engines.timing import Timing

    def t(name: str, ms: float) -> Timing:
        return Timing(name, (ms, ms, ms))

    timings = {BASELINE: t(BASELINE, 10.0), "ort[all,threads=1](fused)": t("ort[all,threads=1](fused)", 9.8),
               "tvm": t("tvm", 50.0)}
    assert choose(timings, tie_floor=0.05).name == BASELINE
    timings["tvm-tuned"] = t("tvm-tuned", 7.0)
    assert choose(timings, tie_floor=0.05).name == "tvm-tuned"


def test_tuning_record_names_no_machine_path(converted_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's tuning entries name the database folder relative to the artifact, as the
    config does: it recorded MetaSchedule's work_dir as an absolute path of this machine."""
    from hmt.fuse.engines import tvm as tvm_engine

    def fake_tune(mod: object, target: object, *, work_dir: Path, trials: int, seed: int,
                  progress: object = None) -> tvm_engine.TuningRecord:
        work_dir.mkdir(parents=True, exist_ok=True)
        return tvm_engine.TuningRecord(trials, 1, 0.0, str(work_dir), 0, 0, "random")

    monkeypatch.setattr(tvm_engine, "tune", fake_tune)
    options = FuseOptions(engines=("tvm",), tune_trials=1, tuning_dir=tmp_path / "db", repeats=2, warmup=1)
    fuse_model(converted_dir, tmp_path / "fused", options=options)
    text = (tmp_path / "fused" / "report.json").read_text()
    assert str(tmp_path) not in text
    tuned = json.loads(text)["variants"][0]["candidates"]["tvm-tuned"]
    assert tuned["tuning"][0]["work_dir"] == "../db"


@pytest.mark.slow
def test_tvm_tuning_writes_and_reuses_a_database(converted_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "tuning"
    options = FuseOptions(engines=("ort", "tvm"), tune_trials=8, tuning_dir=db, repeats=3, warmup=1)
    first = fuse_model(converted_dir, tmp_path / "f1", options=options)
    tuned = first.report["variants"][0]["candidates"]["tvm-tuned"]
    assert tuned["verification"]["passed"] and tuned["tuning"][0]["database_records_after"] > 0
    second = fuse_model(converted_dir, tmp_path / "f2", options=options)
    again = second.report["variants"][0]["candidates"]["tvm-tuned"]["tuning"][0]
    assert again["database_records_before"] == tuned["tuning"][0]["database_records_after"]


def test_gpu_device_also_times_the_host_cpu(segmented_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU device the host's CPU competes too (small graphs at batch 1 often run faster
    there); here CUDA is faked as present, its sessions fall back to the CPU."""
    from hmt.fuse.engines import ort as ort_engine
    from hmt.fuse.runtime import load_fused_runner

    monkeypatch.setattr(ort_engine, "effective_device", lambda device: device)
    out = tmp_path / "fused"
    result = fuse_model(segmented_dir, out, options=FuseOptions(engines=("ort",), repeats=2, warmup=1,
                                                                device="cuda"))
    candidates = result.report["variants"][0]["candidates"]
    host = {label: c for label, c in candidates.items() if label.endswith("@cpu")}
    assert "ort[all,threads=1](fused)@cpu" in host and "ort[all,threads=1](chain)@cpu" in host
    assert all(c["ort_device"] == "cpu" for c in host.values())
    assert all(c["ort_device"] == "cuda" for label, c in candidates.items() if label not in host)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    reference = load_fused_runner(out, "model", {"input": x}, candidate="ort[all,threads=1](fused)")()[0]
    for label in host:
        np.testing.assert_allclose(load_fused_runner(out, "model", {"input": x}, candidate=label)()[0], reference,
                                   atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("repeats", "warmup"), [(0, 3), (-1, 3), (5, -1)])
def test_negative_repeats_and_warmup_are_refused_before_anything_is_read(tmp_path: Path, repeats: int,
                                                                        warmup: int) -> None:
    """--repeats -1 timed three rounds and --warmup -1 warmed up nothing, without a word."""
    with pytest.raises(UsageError, match="--repeats must be >= 1 and --warmup >= 0"):
        fuse_model(tmp_path / "nowhere", tmp_path / "o", options=FuseOptions(repeats=repeats, warmup=warmup))
