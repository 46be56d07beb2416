"""fuse's per-variant run-time choice travels through deploy into what serve runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hmt.bundle import load_bundle
from hmt.runtime.chain import ChainRunner, MergedChainRunner
from hmt.runtime.variant import VariantRuntime, example_input, load_variant


def _deploy_conftest() -> Any:
    import importlib.util

    path = Path(__file__).with_name("conftest.py")
    spec = importlib.util.spec_from_file_location("_deploy_conftest_for_runtime", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chain_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fused artifact whose choice is the merged chain (forced: timing would make it a coin toss
    between near-equal candidates on a shared machine), and its bundle."""
    import hmt.fuse.pipeline as pipeline
    from hmt.convert import TorchSource, convert_model
    from hmt.deploy import DeployOptions, deploy_bundle
    from hmt.fuse import FuseOptions, fuse_model

    helpers = _deploy_conftest()
    root = tmp_path_factory.mktemp("runtime-choice")
    (root / "seg.py").write_text(helpers._segmented_source())
    convert_model(TorchSource(f"{root / 'seg.py'}:segmented", ((1, 3, 16, 16),)), root / "converted")
    real_choose = pipeline.choose

    def prefer_chain(timings: dict[str, Any], *, tie_floor: float) -> Any:
        chained = [t for name, t in timings.items() if name.endswith("(chain)")]
        return chained[0] if chained else real_choose(timings, tie_floor=tie_floor)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pipeline, "choose", prefer_chain)
        fuse_model(root / "converted", root / "fused", options=FuseOptions(engines=("ort",), repeats=2, warmup=1))
    report = json.loads((root / "fused" / "report.json").read_text())
    arch_id = str(report["variants"][0].get("arch_id") or report["variants"][0]["name"])
    helpers.make_pareto(root / "pareto", [helpers.point(arch_id)])
    deploy_bundle(root / "fused", root / "pareto", root / "bundle",
                  options=DeployOptions(target="x86-64", engines=("onnxruntime",)))
    return root / "fused", root / "bundle"


def test_bundle_records_fuses_choice(chain_bundle: tuple[Path, Path]) -> None:
    fused, bundle_dir = chain_bundle
    entry = json.loads((fused / "report.json").read_text())["variants"][0]
    bundle = load_bundle(bundle_dir)
    variant = bundle.spec.variants[0]
    runtime = VariantRuntime.of(variant)
    assert runtime.choice == "merged_chain"
    assert runtime.merged_candidate == entry["choice"]["candidate"]
    assert runtime.merged_ort is not None and runtime.merged_ort.to_json() == entry["choice"]["ort"]
    assert runtime.per_graph_candidate == entry["choice_per_graph"]["candidate"]
    # The bundled chain is byte for byte the graph fuse timed.
    assert bundle.path(runtime.merged_onnx or "").read_bytes() == (fused / entry["choice"]["onnx"]).read_bytes()


def test_serve_runs_the_merged_chain_fuse_chose(chain_bundle: tuple[Path, Path]) -> None:
    from hmt.serve.running.session import SessionOptions, open_controller

    _, bundle_dir = chain_bundle
    controller = open_controller(bundle_dir, SessionOptions(no_early_exit=True))
    controller.start(background=False)
    active = controller._active
    assert isinstance(active, MergedChainRunner)
    status = controller.status()
    assert status["layout"] == "merged_chain" and any("merged chain" in n for n in status["runtime_notes"])
    bundle = controller.bundle
    x = example_input(bundle, np.random.default_rng(3))
    per_graph = load_variant(bundle, active.arch_id, early_exit=True)
    assert isinstance(per_graph, ChainRunner)
    merged = controller.predict(x)
    reference = per_graph.run(x, None)
    assert merged.class_index == reference.class_index
    assert merged.confidence == pytest.approx(reference.confidence, abs=1e-4)
    # With early exit on, serve runs graph by graph with fuse's per-graph options.
    with_exits = open_controller(bundle_dir, SessionOptions())
    with_exits.start(background=False)
    assert isinstance(with_exits._active, ChainRunner)
    assert any("per-graph" in n for n in with_exits._active.notes) or \
        VariantRuntime.of(bundle.spec.variants[0]).ort is None


def test_a_variant_fuse_measured_on_the_host_cpu_stays_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """fuse on a GPU device may find ORT on the host's CPU fastest; the bundle says so and the
    runtime opens that variant with the CPU provider only, whatever serve offers."""
    import hmt.runtime.variant as variant_mod
    from hmt.bundle import BundleVariant
    from hmt.deploy.sources import FusedVariant, runtime_entry
    from hmt.errors import ArtifactError

    fused = FusedVariant.__new__(FusedVariant)
    object.__setattr__(fused, "choice_per_graph", {"engine": "ort", "candidate": "ort[all,threads=1](fused)@cpu",
                                                   "ort": {"level": "all", "intra_op_threads": 1,
                                                           "allow_spinning": False}, "ort_device": "cpu"})
    object.__setattr__(fused, "choice", {"candidate": "ort[all,threads=1](fused)@cpu", "graphs": "fused"})
    entry, merged = runtime_entry(fused, exit_stage=0, folder="variants/x", engines=("onnxruntime",))
    assert merged is None and entry is not None and entry["per_graph"]["ort_device"] == "cpu"
    variant = BundleVariant.__new__(BundleVariant)
    object.__setattr__(variant, "extra", {"runtime": entry})
    object.__setattr__(variant, "arch_id", "x")
    runtime = VariantRuntime.of(variant)
    assert runtime.ort_device == "cpu"
    assert variant_mod.providers_as_measured(("cuda", "cpu"), runtime.ort_device) == ("cpu",)
    assert variant_mod.providers_as_measured(("cuda", "cpu"), "cuda") == ("cuda", "cpu")
    bad = dict(entry, per_graph={**entry["per_graph"], "ort_device": "tpu"})
    object.__setattr__(variant, "extra", {"runtime": bad})
    with pytest.raises(ArtifactError, match="ort_device"):
        VariantRuntime.of(variant)


def test_the_device_profiles_thread_count_replaces_fuses() -> None:
    """fuse timed its candidates on the build machine; the bundle runs the thread count the device
    profile was measured with, on the per-graph and the merged-chain sessions alike."""
    from hmt.deploy.sources import FusedVariant, profile_threads, runtime_entry

    fused = FusedVariant.__new__(FusedVariant)
    ort = {"level": "all", "intra_op_threads": 0, "allow_spinning": True}
    object.__setattr__(fused, "choice_per_graph", {"engine": "ort", "candidate": "ort[all](fused)", "ort": dict(ort)})
    object.__setattr__(fused, "choice", {"candidate": "ort[all](chain)", "graphs": "chain", "onnx": "c.onnx",
                                         "ort": dict(ort)})
    object.__setattr__(fused, "segments", (object(),))
    entry, _ = runtime_entry(fused, exit_stage=0, folder="variants/x", engines=("onnxruntime",), threads=1)
    assert entry is not None
    assert entry["per_graph"]["ort"]["intra_op_threads"] == 1 and entry["merged_chain"]["ort"]["intra_op_threads"] == 1
    assert entry["per_graph"]["ort"]["allow_spinning"] is True  # only the count changes
    kept, _ = runtime_entry(fused, exit_stage=0, folder="variants/x", engines=("onnxruntime",))
    assert kept is not None and kept["per_graph"]["ort"]["intra_op_threads"] == 0
    assert profile_threads({"device": {"engine": "onnxruntime", "threads": 2}})[0] == 2
    assert profile_threads({"device": {"engine": "onnxruntime", "threads": 0}}) == (None, [])
    assert profile_threads({"device": {"engine": "torch", "threads": 4}}) == (None, [])


@pytest.mark.parametrize("early_exit", [True, False])
def test_a_jetson_bundle_pinned_to_the_cpu_says_so(fused_dir: Path, pareto_dir: Path, tmp_path: Path,
                                                  early_exit: bool) -> None:
    """fuse on a CPU records ort_device "cpu", so serve opens the Jetson bundle's variants with the CPU
    provider only; the runner's notes (``/v1/status`` runtime_notes) must say that tensorrt and cuda,
    which the target lists, were not tried (they said nothing, beside a providers list naming them)."""
    from hmt.deploy import DeployOptions, deploy_bundle
    from hmt.runtime.variant import bundle_providers

    out = tmp_path / "nano"
    deploy_bundle(fused_dir, pareto_dir, out, options=DeployOptions(target="jetson-nano", archive=False))
    bundle = load_bundle(out)
    providers = bundle_providers(bundle)
    assert providers == ("tensorrt", "cuda", "cpu")
    for variant in bundle.spec.variants:
        assert VariantRuntime.of(variant).ort_device == "cpu"
        runner = load_variant(bundle, variant.arch_id, providers=providers, early_exit=early_exit)
        assert any("runs on the CPU provider only; tensorrt, cuda not tried" in n for n in runner.notes), runner.notes
    # A CPU-only target's list loses nothing, and says nothing.
    runner = load_variant(bundle, bundle.spec.variants[0].arch_id, providers=("cpu",), early_exit=early_exit)
    assert not any("not tried" in n for n in runner.notes)
