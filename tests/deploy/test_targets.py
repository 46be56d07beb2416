"""The target registry: every entry complete, honest about GPU code, with a loadable profile."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import commands.deploy  # noqa: F401 - registers the command
from commands.app import app
from hmt.deploy.targets import ARCH_ELF_MACHINE, TARGETS, default_profile_path, get_target
from hmt.errors import UsageError

REQUIRED = ("x86-64", "jetson-nano", "jetson-xavier-nx", "raspberry-pi-4b", "aarch64")


def test_required_targets_are_registered() -> None:
    assert set(REQUIRED) <= set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_target_entry_is_complete(name: str) -> None:
    target = get_target(name)
    assert target.arch in ARCH_ELF_MACHINE
    tvm = target.tvm_target
    assert tvm["kind"] == "llvm" and tvm["mtriple"].startswith(target.arch.replace("_", "-").split("-")[0])
    assert tvm["mcpu"]
    assert any("onnxruntime" in r for r in target.runtimes)
    # TVM code only where the device can install a runtime for it; otherwise the entry says why not.
    assert target.runs_tvm == any("TVM" in r or "tvm" in r for r in target.runtimes)
    assert target.runs_tvm or (target.no_tvm_reason and "ONNX Runtime" in target.no_tvm_reason)
    if target.arch == "aarch64":
        assert target.cross_compiler == "aarch64-linux-gnu-gcc"
        assert target.cross_compiler_package == "gcc-aarch64-linux-gnu"
    if target.gpu is not None:
        # No bundle carries GPU code: the entry must say so, and what the ONNX graphs are for.
        assert "no GPU code" in target.gpu.code and "TensorRT" in target.gpu.code
        assert target.gpu.cuda_arch.startswith("sm_")
    if target.default_profile is not None:
        from hmt.profile.schema import read_profile_json

        profile = read_profile_json(default_profile_path(target))
        assert profile.doc["facts"]["arch"] == target.arch
    from hmt.runtime.ort import PROVIDER_NAMES

    assert target.providers and target.providers[-1] == "cpu"
    assert set(target.providers) <= set(PROVIDER_NAMES)
    if target.gpu is not None:
        assert "cuda" in target.providers  # a board bought for its GPU lists it
    assert list(target.to_json_dict()["providers"]) == list(target.providers)
    json.dumps(target.to_json_dict())


def test_jetsons_name_their_gpus() -> None:
    assert get_target("jetson-nano").gpu.cuda_arch == "sm_53"  # type: ignore[union-attr]
    assert get_target("jetson-xavier-nx").gpu.cuda_arch == "sm_72"  # type: ignore[union-attr]
    assert get_target("jetson-nano").memory_bytes == 4 * 1024**3


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match="known targets: x86-64, jetson-nano"):
        get_target("pdp-11")
    with pytest.raises(UsageError, match="--profile"):
        default_profile_path(get_target("aarch64"))


def test_list_targets_cli() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["deploy", "--list-targets", "--json"])
    assert result.exit_code == 0, result.output
    names = [t["name"] for t in json.loads(result.stdout)["targets"]]
    assert names == list(TARGETS)
    human = runner.invoke(app, ["deploy", "--list-targets"])
    assert human.exit_code == 0 and "sm_53" in human.output and "no GPU code" in human.output
    bad = runner.invoke(app, ["deploy", "--target", "nope", "--fused", "f", "--pareto", "p"])
    assert bad.exit_code == UsageError.exit_code and "known targets" in bad.output
    assert "Traceback" not in bad.output


def test_a_bundle_without_a_front_says_where_one_comes_from() -> None:
    result = CliRunner().invoke(app, ["deploy", "--fused", "f", "--target", "x86-64"])
    assert result.exit_code == UsageError.exit_code and "Traceback" not in result.output
    message = " ".join(result.output.split())
    assert "building a bundle needs --pareto" in message and "train-supernet --model" in message


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_python_floor_note_says_hmt_serve_runs_there_and_the_real_onnxruntime_floor(name: str) -> None:
    """The notes told a board user to start serve from Python (hmt.serve.running.session.serve_forever)
    on 3.8, where `hmt serve` runs (commands/device_cli.py), and named onnxruntime 1.19 as the floor."""
    from hmt.runtime.ort import ORT_MIN_VERSION

    target = get_target(name)
    text = " ".join([*target.notes, *target.runtimes])
    assert "serve_forever" not in text and "`hmt serve BUNDLE` runs there" in text
    assert f"onnxruntime>={'.'.join(map(str, ORT_MIN_VERSION))}" in target.runtimes
