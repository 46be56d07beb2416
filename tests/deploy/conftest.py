"""Tiny fused + pareto artifacts for deploy: fuse's segmented test model and a hand-made front."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hmt.artifacts import ParentRecord


def _segmented_source() -> str:
    # Reuse fuse's tiny segmented model (segments + exit heads) rather than a copy of it.
    path = Path(__file__).resolve().parents[1] / "fuse" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_fuse_conftest_for_deploy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.SEGMENTED)


@pytest.fixture(scope="session")
def fused_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hmt.convert import TorchSource, convert_model
    from hmt.fuse import FuseOptions, fuse_model

    root = tmp_path_factory.mktemp("deploy-inputs")
    (root / "seg.py").write_text(_segmented_source())
    convert_model(TorchSource(f"{root / 'seg.py'}:segmented", ((1, 3, 16, 16),)), root / "converted")
    fuse_model(root / "converted", root / "fused", options=FuseOptions(engines=("ort",), repeats=2, warmup=1))
    return root / "fused"


@pytest.fixture(scope="session")
def variant_id(fused_dir: Path) -> str:
    report = json.loads((fused_dir / "report.json").read_text())
    entry = report["variants"][0]
    return str(entry.get("arch_id") or entry["name"])


def point(arch_id: str, *, accuracy: float = 0.6, latency_ms: float = 1.5) -> dict[str, Any]:
    return {"arch_id": arch_id, "accuracy": accuracy, "accuracy_per_exit": [0.4, accuracy], "exit_stage": 1,
            "latency_ms": latency_ms, "energy": 100.0, "memory_mb": 0.5, "engine": "onnxruntime",
            "predicted_for": "amd-epyc-2c-cpu_onnxruntime1.32", "macs": 1000, "params": 100}


# What pareto records of the supernet's data (deploy carries it into the bundle).
DATASET = {"name": "cifar10", "modality": "image", "input_shape": [3, 32, 32], "num_classes": 10,
           "class_names": None, "mean": [0.49, 0.48, 0.45], "std": [0.25, 0.24, 0.26], "source_sha256": "0" * 64}


def make_pareto(out: Path, points: Sequence[dict[str, Any]], *, parents: Sequence[ParentRecord] = (),
                dataset: dict[str, Any] | None = DATASET, energy_unit: str = "mJ") -> Path:
    from hmt.pareto.artifact import FRONT_SCHEMA, FRONT_SCHEMA_VERSION, write_pareto_artifact
    from hmt.pareto.index import FrontIndex, IndexEntry

    doc = {"schema": FRONT_SCHEMA, "schema_version": FRONT_SCHEMA_VERSION, "points": list(points),
           "profile": {"id": "amd-epyc-2c-cpu_onnxruntime1.32"},
           "units": {"accuracy": "fraction", "latency_ms": "ms", "energy": energy_unit, "memory_mb": "MB (1e6 B)"}}
    if dataset is not None:
        doc["dataset"] = dataset
    index = FrontIndex([IndexEntry.from_json_dict(p) for p in points], meta={"space_tag": "test"},
                       units={"accuracy": "fraction", "latency_ms": "ms", "energy": energy_unit, "memory_mb": "MB"})
    return write_pareto_artifact(out, front_doc=doc, index=index, archive_rows=[], plot_png=b"", config={},
                                 parents=parents, metrics={})


@pytest.fixture(scope="session")
def pareto_dir(tmp_path_factory: pytest.TempPathFactory, variant_id: str) -> Path:
    root = tmp_path_factory.mktemp("deploy-pareto")
    return make_pareto(root / "pareto", [point(variant_id), point("other.e0.xxx", accuracy=0.3, latency_ms=0.5)])


@pytest.fixture(scope="session")
def x86_bundle(tmp_path_factory: pytest.TempPathFactory, fused_dir: Path, pareto_dir: Path) -> Path:
    """An x86-64 bundle built once (TVM compiled for the host's arch); tests copy it before changing it."""
    from hmt.deploy import DeployOptions, deploy_bundle

    out = tmp_path_factory.mktemp("deploy-bundle") / "bundle"
    deploy_bundle(fused_dir, pareto_dir, out, options=DeployOptions(target="x86-64", latency_ms=5.0, memory_mb=64.0))
    return out


@pytest.fixture
def bundle_copy(x86_bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(x86_bundle, copy)
    return copy


@pytest.fixture
def pareto_maker() -> Any:
    """``make(out, arch_ids)``: a pareto artifact whose front holds those variants."""

    def make(out: Path, arch_ids: Sequence[str]) -> Path:
        return make_pareto(out, [point(a) for a in arch_ids])

    return make
