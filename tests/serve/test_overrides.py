"""Serve settings overridden at start (--serve-config, HMT_SERVE_*, --set, flags) over a signed bundle's
serve.json, which stays byte-for-byte untouched and still verifies; /v1/status says where each value came from."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest

from hmt.artifacts import load_artifact
from hmt.artifacts.signing import generate_key_pair, load_private_key, sign_artifact_dir
from hmt.bundle import load_checked_bundle
from hmt.errors import InputError, UsageError
from hmt.serve.http.api import create_app
from hmt.serve.running.overrides import (
    BUNDLE,
    DEFAULT,
    LEAVES,
    Layer,
    env_layer,
    file_layer,
    layered_settings,
    set_layer,
)
from hmt.serve.running.session import SessionOptions, open_controller

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_layers_in_order_with_sources() -> None:
    bundle = {"budgets": {"latency_ms": 20}, "switch": {"min_dwell_s": 0.5}}
    settings, report = layered_settings(bundle, [
        Layer("--serve-config f.json", {"budgets.latency_ms": 30, "monitor_period_s": 0.5}),
        env_layer({"HMT_SERVE_BUDGETS__LATENCY_MS": "35", "HMT_SERVE_TOKEN": "not-a-setting", "OTHER": "1"}),
        set_layer(["budgets.latency_ms=40", "engine=onnxruntime", "early_exit.enabled=false"]),
    ])
    assert settings.budgets.latency_ms == 40 and settings.monitor_period_s == 0.5
    assert settings.engine == "onnxruntime" and settings.early_exit.enabled is False
    assert report["budgets.latency_ms"] == {"value": 40, "source": "--set"}
    assert report["monitor_period_s"]["source"] == "--serve-config f.json"
    assert report["switch.min_dwell_s"] == {"value": 0.5, "source": BUNDLE}
    assert report["switch.miss_streak"]["source"] == DEFAULT
    assert set(report) == set(LEAVES)  # every setting is shown, and every setting can be overridden
    assert len(LEAVES) >= 30


@pytest.mark.parametrize(("layer", "words"), [
    (lambda: set_layer(["budgets.latncy_ms=40"]), "--set: unknown serve setting 'budgets.latncy_ms'; did you mean "
                                                  "budgets.latency_ms"),
    (lambda: set_layer(["switch.miss_streak=often"]), "--set: switch.miss_streak must be an integer, got \"often\""),
    (lambda: set_layer(["monitor_period_s=-1"]), "--set (monitor_period_s): "),
    (lambda: set_layer(["budgets=3"]), "budgets"),
    (lambda: set_layer(["novalue"]), "expected KEY=VALUE"),
    (lambda: env_layer({"HMT_SERVE_SWITCH__NOPE": "1"}), "environment variable HMT_SERVE_SWITCH__NOPE: unknown"),
    (lambda: env_layer({"HMT_SERVE_ENGINE": "quantum"}), "environment (engine): "),
])
def test_unknown_keys_and_bad_values_name_the_key(layer: object, words: str) -> None:
    with pytest.raises(UsageError) as err:
        layered_settings({}, [layer()])  # type: ignore[operator]
    assert words in str(err.value)


def test_serve_config_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "serve-extra.json"
    path.write_text("{nope")
    with pytest.raises(InputError, match="serve-extra.json: not valid JSON"):
        file_layer(path)
    path.write_text(json.dumps({"switch": {"min_dwell": 0}}))
    with pytest.raises(UsageError, match="--serve-config serve-extra.json: unknown serve setting 'switch.min_dwell'"):
        layered_settings({}, [file_layer(path)])
    with pytest.raises(InputError, match="cannot read"):
        file_layer(tmp_path / "missing.json")
    # json.loads raises RecursionError and UnicodeDecodeError for these: still one InputError naming the file
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(InputError, match="serve-extra.json: not valid JSON"):
        file_layer(path)
    deep = "[" * 5000 + "]" * 5000
    assert set_layer([f"budgets.latency_ms={deep}"]).values == {"budgets.latency_ms": deep}  # then refused by value


def test_overrides_over_a_signed_bundle_that_still_verifies(bundle_dir: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir, bundle)
    private, public = generate_key_pair(tmp_path / "keys" / "key.pem")
    sign_artifact_dir(bundle, load_artifact(bundle, kind="bundle").manifest_sha256, load_private_key(private))
    before = digest(bundle)
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"budgets": {"latency_ms": 25}, "estimates": {"probe_share": 0.0}}))
    options = SessionOptions(trusted_key=public, latency_ms=None, layers=(
        file_layer(extra), env_layer({"HMT_SERVE_SWITCH__MISS_STREAK": "5"}), set_layer(["budgets.memory_mb=100"])))
    controller = open_controller(bundle, options, warmup_runs=1)
    assert controller.settings.budgets.latency_ms == 25 and controller.settings.budgets.memory_mb == 100
    assert controller.settings.switch.miss_streak == 5
    controller.start(background=False)
    with TestClient(create_app(controller)) as client:
        settings = client.get("/v1/status").json()["settings"]
    assert settings["budgets.latency_ms"] == {"value": 25, "source": "--serve-config extra.json"}
    assert settings["switch.miss_streak"] == {"value": 5, "source": "environment"}
    assert settings["budgets.memory_mb"] == {"value": 100, "source": "--set"}
    assert settings["switch.min_dwell_s"]["source"] == BUNDLE  # FAST_SWITCH, from the bundle's serve.json
    controller.stop()
    assert digest(bundle) == before  # serve.json and the signature untouched
    load_checked_bundle(bundle, trusted_key=public)  # and the bundle still verifies against its signature
