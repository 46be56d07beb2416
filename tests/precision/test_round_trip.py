"""The precision gene end to end on the tiny supernet: pareto -> convert -> fuse -> deploy -> serve.

pareto quantises its fp32 front (measured accuracy, measured speed ratio), the INT8 copy
keeps an id that says its precision, convert rebuilds and re-measures it, fuse times it
like any variant, deploy bundles it and serve loads it beside the fp32 one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

TINY = {
    "backbone": "cifar_resnet8", "batch_size": 32, "max_train_samples": 32, "backbone_epochs": 1,
    "partition_epochs": 0, "distill_epochs": 0, "finetune_epochs": 0, "eval_variants": 0,
    "eval_batch_size": 256, "val_fraction": 0.05, "device": "cpu",
}
NANO = Path(__file__).resolve().parents[2] / "profiles" / "jetson-nano.json"


@pytest.fixture(scope="module")
def tiny_supernet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from hmt.supernet.train import resolve_config, train_supernet

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two spinning OpenMP threads crawl on a shared 2-core box
    try:
        out = tmp_path_factory.mktemp("precision") / "supernet"
        train_supernet(resolve_config(overrides=TINY), out)
    finally:
        torch.set_num_threads(before)
    return out


def test_int8_gene_round_trips(tiny_supernet: Path, tmp_path: Path) -> None:
    from hmt.bundle import load_bundle
    from hmt.convert import ConvertOptions, SupernetSource, convert_model
    from hmt.deploy import DeployOptions, deploy_bundle
    from hmt.fuse import FuseOptions, fuse_model
    from hmt.pareto import ParetoOptions, SearchOptions, find_front, load_front
    from hmt.pareto.precision import PrecisionOptions
    from hmt.precision import split_variant_id
    from hmt.serve.running.runner import load_runner

    # A loose bound: the tiny supernet is barely trained (~10-20%), so a few of its 100
    # held-out images flipping is noise; the bound itself is tested in test_quantize.py.
    run = find_front(tiny_supernet, NANO, tmp_path / "pareto", ParetoOptions(
        search=SearchOptions(method="random", evaluations=4, population=4, seed=0), threads=1,
        precision=PrecisionOptions(precisions=("fp32", "int8"), max_accuracy_drop=0.2, max_candidates=2,
                                   timing_repeats=5)))
    checks = json.loads(
        (tmp_path / "pareto" / "front.json").read_text())["precision"]["checks"]
    assert 1 <= len(checks) <= 2
    for check in checks:
        assert "accuracy_per_exit" in check and check["latency_ratio_measured_here"] > 0
    assert "hypervolume_acc_latency_fp32_only" in run.metrics
    assert run.metrics["hypervolume_acc_latency"] >= run.metrics["hypervolume_acc_latency_fp32_only"]
    front = load_front(tmp_path / "pareto")
    int8 = [p for p in front.points if p["precision"] == "int8"]
    if not int8:
        pytest.skip("no int8 variant made this tiny front (all dominated); the gene is covered by the checks")
    point = int8[0]
    assert point["arch_id"] == point["base_arch_id"] + ".int8"
    assert any(e.arch_id == point["arch_id"] for e in front.index.entries)

    # convert rebuilds it from the id alone (and measures it again), fuse times it.
    fp32_id = point["base_arch_id"]
    convert_model(SupernetSource(tiny_supernet, (fp32_id, point["arch_id"])), tmp_path / "converted",
                  options=ConvertOptions(max_accuracy_drop=0.2))
    report = json.loads((tmp_path / "converted" / "report.json").read_text())
    by_id = {v["arch_id"]: v for v in report["variants"]}
    assert by_id[point["arch_id"]]["precision"] == "int8"
    assert by_id[point["arch_id"]]["quantisation"]["accuracy"]["passed"]
    assert by_id[fp32_id]["precision"] == "fp32"
    fuse_model(tmp_path / "converted", tmp_path / "fused",
               options=FuseOptions(engines=("ort",), repeats=2, warmup=1, timing_burst=2))
    fused = json.loads((tmp_path / "fused" / "report.json").read_text())
    assert {v["arch_id"] for v in fused["variants"]} == {fp32_id, point["arch_id"]}
    siblings = json.loads((tmp_path / "fused" / "manifest.json").read_text())["metrics"]["precision_vs_fp32"]
    assert siblings[point["arch_id"]]["fp32"] == fp32_id and siblings[point["arch_id"]]["speedup_vs_fp32"] > 0

    # deploy bundles exactly what is on the front; serve loads the int8 variant by its id.
    on_front = {p["arch_id"] for p in front.points}
    variants = tuple(v for v in (fp32_id, point["arch_id"]) if v in on_front)
    deploy_bundle(tmp_path / "fused", tmp_path / "pareto", tmp_path / "bundle",
                  options=DeployOptions(target="x86-64", engines=("onnxruntime",), variants=variants,
                                        archive=False))
    bundle = load_bundle(tmp_path / "bundle")
    bundled = {v.arch_id: v for v in bundle.spec.variants}
    assert bundled[point["arch_id"]].extra["precision"] == "int8"
    assert any("quantised ONNX graphs" in note for note in bundle.spec.notes)
    from hmt.fuse.engines.ort import OrtConfig

    session = bundled[point["arch_id"]].extra["ort_session"]  # what fuse chose graph by graph, rebuildable
    assert OrtConfig(**session).name.startswith("ort[")
    onnx_file = bundle.artifact.file(bundled[point["arch_id"]].segments[0].onnx)
    import onnx

    assert "QuantizeLinear" in {n.op_type for n in onnx.load(str(onnx_file)).graph.node}
    runner = load_runner(bundle, point["arch_id"], "onnxruntime", 1)
    x = np.random.default_rng(0).standard_normal(bundle.spec.input.shape).astype(np.float32)
    result = runner.run(x, None)
    assert 0 <= result.class_index < bundle.spec.classes
    assert split_variant_id(point["arch_id"]) == (fp32_id, "int8")


def test_convert_refuses_a_quantised_variant_past_the_bound(tiny_supernet: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A badly calibrated INT8 variant (ranges 1000x too wide) is measured, refused, and nothing is written."""
    import torch

    from hmt.convert import ConvertOptions, SupernetSource, convert_model
    from hmt.convert import precision as convert_precision
    from hmt.errors import VerificationError
    from hmt.supernet import load_supernet

    loaded = load_supernet(tiny_supernet)
    net = loaded.materialize(loaded.space.largest())
    real_load = convert_precision.QuantContext.load

    def sabotaged(supernet: Path, options: ConvertOptions) -> convert_precision.QuantContext:
        context = real_load(supernet, options)
        with torch.no_grad():  # labels = the fp32 variant's own answers: fp32 scores ~100%, any damage shows
            labels = net(torch.from_numpy(context.x)).argmax(dim=1).numpy()
        return convert_precision.QuantContext(1000 * context.calibration, context.x, labels, context.source)

    monkeypatch.setattr(convert_precision.QuantContext, "load", staticmethod(sabotaged))
    with pytest.raises(VerificationError, match=r"\.int8: int8 accuracy .* points below fp32"):
        convert_model(SupernetSource(tiny_supernet, ("largest.int8",)), tmp_path / "converted",
                      options=ConvertOptions(max_accuracy_drop=0.05))
    assert not (tmp_path / "converted").exists()


def test_convert_takes_held_out_data_when_the_supernets_is_absent(tmp_path: Path) -> None:
    """The shipped supernet's training data is not on the user's machine: without --data its quantised
    variants are checked on the embedded CIFAR-10 test images (never trained on); with --data, on the
    given data's test split."""
    from hmt.convert import ConvertOptions
    from hmt.convert.precision import QuantContext

    shipped = Path(__file__).resolve().parents[2] / "hmt" / "data" / "embedded" / "supernet-cifar-resnet56"
    fallback = QuantContext.load(shipped, ConvertOptions(accuracy_samples=50))
    assert len(fallback.y) == 50 and fallback.source.startswith("test split of the embedded CIFAR-10 subset")
    embedded = shipped.parent
    context = QuantContext.load(shipped, ConvertOptions(accuracy_samples=50, data_path=embedded))
    assert len(context.y) == 50 and context.source.startswith("test split of the cifar10 data given (sha256 ")
