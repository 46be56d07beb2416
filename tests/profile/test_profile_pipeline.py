"""profile_device end to end on a tiny stand-in supernet, the schema round trip, bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hmt.artifacts import load_artifact
from hmt.errors import ArtifactError, InputError, ModelError, UsageError
from hmt.profile import ProfileOptions, load_profile, profile_device, shipped_profile, stages
from hmt.profile.devices import DEVICES
from hmt.profile.power.fake import FakePowerSource
from hmt.profile.predictor import Predictor
from hmt.profile.schema import DeviceProfile, profile_from_doc, profile_to_json_files, validate_profile


def _options(**kw: Any) -> ProfileOptions:
    base: dict[str, Any] = {"quick": True, "warmup": 1, "repeats": 3, "load_model": False}
    base.update(kw)
    return ProfileOptions(**base)


def test_end_to_end_with_supernet_fake_power_and_validation(tmp_path: Path, fast: Any) -> None:
    out = tmp_path / "profile"
    fake = FakePowerSource(coefficients_mj=(3e-9, 2e-8, 9e-7), idle_w=2.0, sample_hz=5000)
    result = profile_device(out, _options(supernet=tmp_path / "supernet", batches=(1, 2), validate=4,
                                          validate_load_processes=1, load_model=True), power_source=fake)
    profile = load_profile(out)
    assert profile.doc["device"]["origin"] == "measured" and "_onnxruntime1." in profile.device_id
    # The thread count was measured on the largest variant and the table timed with it.
    measured = profile.doc["device"]["threads_measured_ms"]
    assert set(measured) == {str(t) for t in stages.thread_candidates(len(__import__("os").sched_getaffinity(0)))}
    assert profile.doc["device"]["threads"] == stages.choose_threads({int(t): v for t, v in measured.items()})
    # Block table: every (position, choice) at batch 1 and 2.
    table = profile.table("block_latency")
    assert len(table) == 2 * len(fast.net.iter_block_choices())
    assert (table.latency_ms > 0).all() and {"freq_mhz", "background_util", "p10_ms", "p90_ms"} <= set(table)
    # Energy calibrated by the fake meter, in mJ, with provenance.
    energy = profile.doc["models"]["energy"]
    assert energy["calibrated"] and energy["unit"] == "mJ"
    assert profile.doc["provenance"]["power"]["origin"] == "measured"
    # Both eq. 2 forms were fitted and reported, each with its held-out error only (no in-sample R^2/MAPE).
    assert set(profile.doc["models"]["latency_fits"]) == {"eq2", "eq2+overhead"}
    for entry in [*profile.doc["models"]["latency_fits"].values(), profile.doc["models"]["latency"], energy]:
        assert "cv_mape" in entry and "mape" not in entry and "r2" not in entry
    # Validation metrics and the scatter plot in the artifact; the supernet is a parent.
    assert result.validation is not None and result.validation.idle.n == 4
    assert result.validation.loaded is not None and result.validation.loaded.n == 4
    load = profile.doc["models"]["load"]
    assert load["alpha"]["value"] >= 0 and isinstance(load["identifiable"], bool)
    assert {fast.space.smallest().arch_id, fast.space.largest().arch_id} <= set(profile.table("load_samples").label)
    artifact = load_artifact(out, kind="device-profile")
    assert {"profile.json", "validation.png"} <= {f.path for f in artifact.manifest.files}
    assert artifact.manifest.parents[0].kind == "supernet"
    assert profile.doc["supernet"]["path"] == "../supernet"  # relative, never a path of this machine
    assert artifact.manifest.metrics["device"] == "host"
    # The predictor reproduces a variant's table sum and refuses unknown blocks.
    predictor = Predictor(profile)
    arch = fast.space.largest()
    assert predictor.block_sum_ms(fast.net.variant_blocks(arch)) > 0
    with pytest.raises(ModelError, match="nope/x"):
        predictor.block_sum_ms([("nope", "x")])
    layers = __import__("hmt.profile.features", fromlist=["x"]).layer_features(fast.net.materialize(arch), (3, 16, 16))
    assert predictor.eq2_ms(layers) > 0 and predictor.energy(layers)[1] == "mJ"


def test_failed_run_keeps_the_good_profile(tmp_path: Path, fast: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "profile"
    profile_device(out, _options())
    before = (out / "profile.json").read_bytes()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("killed half-way")

    monkeypatch.setattr(stages, "energy_section", broken)
    with pytest.raises(RuntimeError, match="half-way"):
        profile_device(out, _options())
    assert (out / "profile.json").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial") or "previous" in p.name]
    load_profile(out)


def test_bad_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="unknown device 'pixel-9'"):
        profile_device(tmp_path / "p", ProfileOptions(device="pixel-9"))
    with pytest.raises(UsageError, match="--validate needs --supernet"):
        profile_device(tmp_path / "p", ProfileOptions(validate=3))
    with pytest.raises(UsageError, match="unknown power source"):
        profile_device(tmp_path / "p", ProfileOptions(power="joulemeter"))
    with pytest.raises(UsageError, match="engine"):
        profile_device(tmp_path / "p", ProfileOptions(engine="tflite"))
    # refused before measuring (--repeats -1 and --threads -1 were internal errors after the benchmarks ran)
    for bad in ({"repeats": -1}, {"repeats": 0}, {"warmup": -1}):
        with pytest.raises(UsageError, match="--repeats must be >= 1 and --warmup >= 0"):
            profile_device(tmp_path / "p", ProfileOptions(quick=True, **bad))
    with pytest.raises(UsageError, match="--threads must be >= 1, got -1"):
        profile_device(tmp_path / "p", ProfileOptions(quick=True, threads=-1))
    # A supernet artifact that fails verification (a file changed after writing).
    from tests.profile.conftest import make_supernet_artifact

    make_supernet_artifact(tmp_path / "sn")
    (tmp_path / "sn" / "space.json").write_text("{}")

    def verified_open(path: Path) -> Any:
        load_artifact(path, kind="supernet")

    monkeypatch.setattr(stages, "open_supernet", verified_open)
    with pytest.raises(ArtifactError, match="space.json"):
        profile_device(tmp_path / "p", ProfileOptions(supernet=tmp_path / "sn"))
    assert not (tmp_path / "p").exists()


def test_unreachable_device_writes_its_estimated_profile(tmp_path: Path) -> None:
    result = profile_device(tmp_path / "nano", ProfileOptions(device="jetson-nano"))
    profile = load_profile(tmp_path / "nano")
    assert profile.doc["device"]["origin"] == "estimated" and result.summary["origin"] == "estimated"
    assert profile.value("facts.cores_logical") == 4


@pytest.mark.parametrize("name", [n for n, d in DEVICES.items() if d.shipped])
def test_shipped_profiles_validate_and_are_regenerated_exactly(name: str) -> None:
    from hmt.profile.devices import profiles_dir
    from hmt.profile.estimated import DEVICES as FIGURES
    from hmt.profile.estimated import render

    profile = shipped_profile(name)
    assert profile.doc["device"]["origin"] == "estimated"
    for entry in profile.doc["provenance"].values():
        assert entry["origin"] == "estimated" and entry["citation"]
    figures = next(f for f in FIGURES if f.name == name)
    assert (profiles_dir() / f"{name}.json").read_bytes() == render(figures)
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((profiles_dir() / "schema.json").read_text())
    jsonschema.validate(profile.doc, schema)


def test_measured_host_profile_if_shipped() -> None:
    from hmt.profile.devices import profiles_dir

    for path in profiles_dir().glob("host-*.json"):
        profile = load_profile(path)
        assert profile.doc["device"]["origin"] == "measured"
        assert profile.value("benchmarks.peak_gemm_gmacs") > 0


def _small_profile() -> DeviceProfile:
    import pandas as pd

    doc = {"schema": "hmt.device-profile", "schema_version": 1,
           "device": {"name": "host", "id": "x_ort1.0", "origin": "measured"},
           "provenance": {"m": {"origin": "measured", "where": "x", "when": "now", "how": "timer"}},
           "benchmarks": {"peak": {"value": 1.5, "unit": "GMAC/s", "source": "m"}}}
    profile = DeviceProfile(doc)
    profile.add_table("big", pd.DataFrame({"size_bytes": np.arange(100), "gbps": np.linspace(1, 2, 100)}),
                      units={"size_bytes": "byte", "gbps": "GB/s"}, source="m")
    profile.add_table("small", pd.DataFrame({"a": [1.0, 2.0]}), units={"a": "ms"}, source="m")
    return profile


def test_schema_round_trip_inline_and_csv(tmp_path: Path) -> None:
    profile = _small_profile()
    files = profile_to_json_files(profile, inline=False)
    assert set(files) == {"profile.json", "big.csv"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    back = profile_from_doc(json.loads(files["profile.json"]), source="t", base_dir=tmp_path)
    assert back.value("benchmarks.peak") == 1.5
    np.testing.assert_allclose(back.table("big").gbps, profile.table("big").gbps, rtol=1e-5)
    inline = json.loads(profile_to_json_files(profile, inline=True)["profile.json"])
    assert len(inline["tables"]["big"]["rows"]) == 100


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("provenance"), "missing top-level field 'provenance'"),
        (lambda d: d.update(schema_version=9), "schema_version 9"),
        (lambda d: d["benchmarks"]["peak"].update(source="nowhere"), "unknown provenance 'nowhere'"),
        (lambda d: d["benchmarks"].update(bare=3.0), "numbers without a unit"),
        (lambda d: d["benchmarks"]["peak"].pop("unit"), "lacks 'unit'"),
        (lambda d: d["provenance"]["m"].pop("how"), "lacks 'how'"),
        (lambda d: d["device"].update(origin="guessed"), "device.origin"),
        (lambda d: d["benchmarks"]["peak"].update(value="fast"), "non-numeric"),
    ],
)
def test_schema_refuses_bad_documents(mutate: Any, message: str) -> None:
    doc = json.loads(profile_to_json_files(_small_profile(), inline=True)["profile.json"])
    mutate(doc)
    with pytest.raises(InputError, match=message):
        validate_profile(doc, source="p.json")


def test_malformed_profile_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(bad)
    files = profile_to_json_files(_small_profile(), inline=False)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "big.csv").write_text("size_bytes,other\n1,2\n")
    with pytest.raises(InputError, match="columns"):
        load_profile(tmp_path / "profile.json")
    with pytest.raises(InputError, match="missing.json: does not exist"):
        load_profile(tmp_path / "missing.json")


def test_tampered_artifact_is_refused(tmp_path: Path, fast: Any) -> None:
    out = tmp_path / "profile"
    profile_device(out, _options())
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "profile.json").write_text((copy / "profile.json").read_text().replace('"host"', '"hots"', 1))
    with pytest.raises(ArtifactError, match="profile.json"):
        load_profile(copy)


def test_thread_candidates_and_the_choice_prefers_fewer_threads() -> None:
    assert stages.thread_candidates(1) == [1]
    assert stages.thread_candidates(2) == [1, 2]
    assert stages.thread_candidates(6) == [1, 2, 4, 6]
    assert stages.choose_threads({1: 10.0, 2: 9.8}) == 1  # 2 % faster is not worth a second thread
    assert stages.choose_threads({1: 10.0, 2: 6.0, 4: 5.9}) == 2
    assert stages.choose_threads({1: 4.0, 2: 6.0}) == 1


def test_given_threads_are_not_measured(tmp_path: Path, fast: Any) -> None:
    profile_device(tmp_path / "p", _options(supernet=tmp_path / "supernet", threads=1))
    device = load_profile(tmp_path / "p").doc["device"]
    assert device["threads"] == 1 and "threads_measured_ms" not in device
