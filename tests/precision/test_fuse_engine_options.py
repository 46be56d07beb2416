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
    from hmt.errors import ModelError

    with pytest.raises(ModelError, match="execution mode"):
        session_options(OrtConfig(execution_mode="sideways"))


def test_fuse_measures_parallel_mode_and_peak_rss(tmp_path: Path) -> None:
    from hmt.convert import TorchSource, convert_model
    from hmt.fuse import FuseOptions, fuse_model

    (tmp_path / "seg.py").write_text(_segmented_source())
    convert_model(TorchSource(f"{tmp_path / 'seg.py'}:segmented", ((1, 3, 16, 16),)), tmp_path / "converted")
    fuse_model(tmp_path / "converted", tmp_path / "fused",
               options=FuseOptions(engines=("ort",), repeats=3, warmup=1, timing_burst=2, measure_rss=True))
    report = json.loads((tmp_path / "fused" / "report.json").read_text())
    (variant,) = report["variants"]
    parallel = [label for label in variant["candidates"] if ",parallel" in label]
    assert parallel, list(variant["candidates"])
    for label in parallel:
        assert variant["candidates"][label]["timing"]["runs"] >= 3  # measured like every candidate
        assert variant["candidates"][label]["ort"]["execution_mode"] == "parallel"
    memory = variant["memory"]
    assert "predicted only" in memory["hmt_plan"]["status"]
    for key in ("ort_memory_plan_on", "ort_memory_plan_off"):
        assert memory[key]["peak_over_import_bytes"] > 0
        assert memory[key]["processes"] == 3
    assert memory["run_bytes_off_minus_on"] == (memory["ort_memory_plan_off"]["run_over_load_bytes"]
                                                - memory["ort_memory_plan_on"]["run_over_load_bytes"])
