"""ORT's parallel execution mode as a fuse candidate, and peak RSS with ORT's memory plan on and off."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hmt.fuse.engines.ort import OrtConfig, session_options


def _segmented_source() -> str:
    path = Path(__file__).resolve().parents[1] / "fuse" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_fuse_conftest_for_precision", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.SEGMENTED)


def test_ort_config_new_fields_keep_old_names_and_round_trip() -> None:
    import onnxruntime as ort

    assert OrtConfig().name == "ort[all,threads=default]"
    assert OrtConfig().to_json() == {"level": "all", "intra_op_threads": 0, "allow_spinning": True}
    parallel = OrtConfig(execution_mode="parallel", inter_op_threads=2)
    assert parallel.name == "ort[all,threads=default,parallel,inter=2]"
    assert OrtConfig(**parallel.to_json()) == parallel
    lean = OrtConfig(mem_pattern=False, cpu_arena=False)
    assert OrtConfig(**lean.to_json()) == lean and "noarena" in lean.name
    options = session_options(parallel)
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.inter_op_num_threads == 2
    assert not session_options(lean).enable_mem_pattern and not session_options(lean).enable_cpu_mem_arena


def test_unknown_execution_mode_is_refused() -> None:
    from hmt.errors import UsageError

    # Refused when the configuration is built (hmt.runtime.ort.OrtOptions), before any session.
    with pytest.raises(UsageError, match="execution_mode"):
        session_options(OrtConfig(execution_mode="sideways"))


FIRE = """
import torch
from torch import nn


class Fire(nn.Module):
    def __init__(self):
        super().__init__()
        self.squeeze = nn.Conv2d(3, 4, 1)
        self.expand1 = nn.Conv2d(4, 8, 1)
        self.expand3 = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1(s)), torch.relu(self.expand3(s))], 1)


def fire():
    torch.manual_seed(0)
    return Fire().eval()
"""


def test_parallel_width_counts_heavy_operators_side_by_side(tmp_path: Path) -> None:
    from hmt.convert import TorchSource, convert_model
    from hmt.convert.graph import load_onnx
    from hmt.fuse.branches import parallel_width

    (tmp_path / "fire.py").write_text(FIRE)
    (tmp_path / "seg.py").write_text(_segmented_source())
    convert_model(TorchSource(f"{tmp_path / 'fire.py'}:fire", ((1, 3, 8, 8),)), tmp_path / "fire")
    convert_model(TorchSource(f"{tmp_path / 'seg.py'}:segmented", ((1, 3, 16, 16),)), tmp_path / "seg")
    assert parallel_width(load_onnx(tmp_path / "fire" / "model" / "model.onnx")) == 2
    report = json.loads((tmp_path / "seg" / "report.json").read_text())
    for graph in report["variants"][0]["graphs"]:
        assert parallel_width(load_onnx(tmp_path / "seg" / graph["file"])) == 1  # a plain chain of convs


def test_fuse_measures_parallel_mode_where_branches_are_and_peak_rss(tmp_path: Path) -> None:
    from hmt.convert import TorchSource, convert_model
    from hmt.fuse import FuseOptions, fuse_model

    (tmp_path / "fire.py").write_text(FIRE)
    (tmp_path / "seg.py").write_text(_segmented_source())
    convert_model(TorchSource(f"{tmp_path / 'fire.py'}:fire", ((1, 3, 8, 8),)), tmp_path / "fire")
    convert_model(TorchSource(f"{tmp_path / 'seg.py'}:segmented", ((1, 3, 16, 16),)), tmp_path / "seg")
    fast = {"engines": ("ort",), "repeats": 3, "warmup": 1, "timing_burst": 2}
    fuse_model(tmp_path / "fire", tmp_path / "fire-fused", options=FuseOptions(**fast, measure_rss=True))
    fuse_model(tmp_path / "seg", tmp_path / "seg-fused", options=FuseOptions(**fast))

    (variant,) = json.loads((tmp_path / "fire-fused" / "report.json").read_text())["variants"]
    parallel = [label for label in variant["candidates"] if ",parallel" in label]
    assert parallel, list(variant["candidates"])
    for label in parallel:
        assert variant["candidates"][label]["timing"]["runs"] >= 3  # measured like every candidate
        assert variant["candidates"][label]["ort"]["execution_mode"] == "parallel"
        assert variant["candidates"][label]["ort"]["inter_op_threads"] >= 2
    assert variant["graphs"][0]["parallel_width"] == 2
    memory = variant["memory"]
    assert "predicted only" in memory["hmt_plan"]["status"]
    for key in ("ort_memory_plan_on", "ort_memory_plan_off"):
        assert memory[key]["peak_over_import_bytes"] > 0
        assert memory[key]["processes"] == 3
    assert memory["run_bytes_off_minus_on"] == (memory["ort_memory_plan_off"]["run_over_load_bytes"]
                                                - memory["ort_memory_plan_on"]["run_over_load_bytes"])

    (chain,) = json.loads((tmp_path / "seg-fused" / "report.json").read_text())["variants"]
    assert not [label for label in chain["candidates"] if ",parallel" in label]  # no branches: not offered
    assert all(g["parallel_width"] == 1 for g in chain["graphs"])
    assert "memory" not in chain
