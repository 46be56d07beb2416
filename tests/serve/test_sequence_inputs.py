"""A sequence bundle (time series, audio features: input [1, C, L]) records the per-channel
standardization it was trained with; raw values sent as such (/v1 JSON ``raw``, /v2 input ``raw``)
get the answer of the standardized tensor."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import FAST_SWITCH, linear_bundle, npy_bytes

from hmt.bundle import Preprocess, load_bundle
from hmt.deploy.sources import _dataset_meta
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.inputs import ApiError, InputSpec, decode

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

C, L = 3, 10
MEAN, STD = (1.5, -2.0, 40.0), (0.5, 3.0, 12.0)


def make_sequence_bundle(out: Path) -> Path:
    """One variant, one stage: flatten [1, 3, 10] -> fixed random [30, 4] matmul -> identity head, with the
    preprocess deploy writes for a sequence dataset."""
    preprocess, _ = _dataset_meta({"modality": "sequence", "mean": MEAN, "std": STD})
    assert preprocess is not None
    return linear_bundle(out, [1, C, L], {"preprocess": {
        "mean": list(preprocess.mean), "std": list(preprocess.std), "layout": preprocess.layout,
        "pixel_scale": preprocess.pixel_scale}})


@pytest.fixture(scope="module")
def sequence_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    bundle = load_bundle(make_sequence_bundle(tmp_path_factory.mktemp("seq") / "bundle"))
    controller = Controller(bundle, ServeSettings.from_mapping({**FAST_SWITCH, "early_exit": {"enabled": False}}),
                            warmup_runs=1)
    controller.start(background=False)
    with TestClient(create_app(controller, ApiOptions(max_batch=8))) as cl:
        yield cl


def raw_values(seed: int, n: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, C, L)) * np.array(STD)[:, None] + np.array(MEAN)[:, None]).astype(np.float32)


def standardized(raw: np.ndarray) -> np.ndarray:
    """The bundle's standardization written out independently."""
    return ((raw.astype(np.float64) - np.array(MEAN)[:, None]) / np.array(STD)[:, None]).astype(np.float32)


def test_deploy_records_a_sequence_datasets_standardization(tmp_path: Path) -> None:
    assert _dataset_meta({"modality": "sequence", "mean": MEAN, "std": STD})[0] == Preprocess(
        mean=MEAN, std=STD, layout="NCL", pixel_scale=1.0)
    spec = InputSpec.of_bundle(load_bundle(make_sequence_bundle(tmp_path / "b")).spec)
    assert spec.sequence is not None and spec.preprocess is None  # not an image: no pixel or JPEG bodies
    raw = raw_values(0)
    np.testing.assert_allclose(decode(json.dumps({"raw": raw.tolist()}).encode(), "application/json", spec),
                               standardized(raw), rtol=1e-6)
    np.testing.assert_array_equal(decode(json.dumps({"inputs": raw.tolist()}).encode(), "application/json", spec),
                                  raw)  # "inputs" stays the model's tensor as given
    with pytest.raises(ApiError) as err:
        decode(json.dumps({"raw": raw[:, :2].tolist()}).encode(), "application/json", spec)
    assert err.value.status == 422 and "[3, 10]" in err.value.message


def test_raw_values_answer_as_their_standardized_tensor(sequence_client: TestClient) -> None:
    raw = raw_values(1)
    tensor = sequence_client.post("/v1/predict", content=npy_bytes(standardized(raw)),
                                  headers={"content-type": "application/x-npy"}).json()["predictions"]
    v1 = sequence_client.post("/v1/predict", json={"raw": raw.tolist()}).json()["predictions"]
    assert [p["class"] for p in v1] == [p["class"] for p in tensor]
    assert [p["confidence"] for p in v1] == pytest.approx([p["confidence"] for p in tensor], rel=1e-5)
    meta = sequence_client.get("/v2/models/bundle").json()
    assert {"name": "raw", "datatype": "FP32", "shape": [-1, C, L]} in meta["inputs"]
    body = {"inputs": [{"name": "raw", "datatype": "FP32", "shape": list(raw.shape), "data": raw.ravel().tolist()}],
            "outputs": [{"name": "class"}, {"name": "confidence"}]}
    v2 = sequence_client.post("/v2/models/bundle/infer", json=body)
    assert v2.status_code == 200, v2.text
    outputs = {o["name"]: o["data"] for o in v2.json()["outputs"]}
    assert outputs["class"] == [p["class"] for p in tensor]
    assert outputs["confidence"] == pytest.approx([p["confidence"] for p in tensor], rel=1e-5)
