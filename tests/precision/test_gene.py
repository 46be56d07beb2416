"""The precision gene's bookkeeping: candidate ids and keys, quantised costs, options, fp16 without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.errors import UsageError
from hmt.pareto.encoding import Candidate
from hmt.pareto.objectives import Costs
from hmt.pareto.precision import PrecisionOptions, _quantised_costs, check_device
from hmt.supernet.space import ArchConfig


def _arch() -> ArchConfig:
    return ArchConfig(space_tag="cifar_resnet8-be92fa", exit_stage=1, choices=("base", "w50", "-"))


def test_candidate_precision_changes_id_and_key_only() -> None:
    fp32 = Candidate(_arch(), "onnxruntime")
    int8 = Candidate(_arch(), "onnxruntime", precision="int8")
    assert fp32.variant_id == fp32.arch.arch_id
    assert int8.variant_id == fp32.arch.arch_id + ".int8"
    assert fp32.key != int8.key
    data = int8.to_json_dict()
    assert data["arch_id"] == int8.variant_id and data["base_arch_id"] == fp32.arch.arch_id
    assert data["precision"] == "int8" and data["choices"] == list(fp32.arch.choices)
    assert fp32.to_json_dict()["precision"] == "fp32" and "base_arch_id" not in fp32.to_json_dict()


def test_quantised_costs_scale_time_and_weights_not_activations() -> None:
    fp32 = Costs(latency_ms=10.0, energy=100.0, memory_mb=5.0, params=1_000_000, macs=7,
                 activation_peak_bytes=1_000_000)
    int8 = _quantised_costs(fp32, "int8", 0.5)
    assert int8.latency_ms == 5.0 and int8.energy == 50.0
    assert int8.memory_mb == pytest.approx(2.0)  # 1 MB of int8 weights + 1 MB of fp32 activations
    assert _quantised_costs(fp32, "fp16", 1.0).memory_mb == pytest.approx(3.0)
    assert int8.params == fp32.params and int8.macs == fp32.macs


def test_precision_options_are_checked() -> None:
    assert PrecisionOptions(precisions=("fp32", "int8", "int8")).extra == ("int8",)
    with pytest.raises(UsageError, match="unknown precision"):
        PrecisionOptions(precisions=("fp32", "int4")).validate()
    with pytest.raises(UsageError):
        PrecisionOptions(max_accuracy_drop=1.5).validate()


def test_fp16_needs_a_cuda_provider() -> None:
    import onnxruntime as ort

    options = PrecisionOptions(precisions=("fp32", "fp16"))
    if "CUDAExecutionProvider" in ort.get_available_providers():
        check_device(options, "cuda")  # a GPU host can time fp16
    else:
        with pytest.raises(UsageError, match="fp16 variants are for GPU providers"):
            check_device(options, "cpu")
    check_device(PrecisionOptions(precisions=("fp32", "int8")), "cpu")


def test_cli_refuses_fp16_without_gpu_and_unknown_precision(tmp_path: Path) -> None:
    import onnxruntime as ort
    from typer.testing import CliRunner

    from commands.app import _register, app

    _register()
    nano = str(Path(__file__).resolve().parents[2] / "profiles" / "jetson-nano.json")
    common = ["pareto", "--supernet", str(tmp_path / "no-supernet"), "--profile", nano, "--out", str(tmp_path / "p")]
    unknown = CliRunner().invoke(app, [*common, "--precision", "int4"])
    assert unknown.exit_code == 2 and "unknown precision(s) int4" in unknown.output
    assert "Traceback" not in unknown.output
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        fp16 = CliRunner().invoke(app, [*common, "--precision", "fp16"])
        # refused before the supernet is even read (it does not exist here)
        assert fp16.exit_code == 2 and "fp16 variants are for GPU providers" in fp16.output
    assert not (tmp_path / "p").exists()


def test_a_quantised_copy_no_faster_than_fp32_is_refused() -> None:
    from hmt.pareto.precision import refusal

    options = PrecisionOptions(precisions=("fp32", "int8"), max_accuracy_drop=0.01)
    assert refusal(0.002, 0.45, True, options) is None
    # Slower (the shipped smallest: 0.019 ms fp32, 0.028 ms int8) or equal: kept off the front,
    # even though its 4x smaller weights would win a memory objective.
    slower = refusal(0.0, 1.45, True, options)
    assert slower is not None and "no faster than fp32" in slower
    assert refusal(-0.01, 1.0, True, options) is not None
    lossy = refusal(0.02, 0.5, True, options)
    assert lossy is not None and "accuracy drop 2.00 > 1.00" in lossy
    assert refusal(0.0, 0.5, False, options) == "outside the budgets"
