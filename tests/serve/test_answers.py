"""Answers people use on /v1: probabilities and top-k with class names on request, refused parameters
instead of ignored ones, multipart image upload."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
from serve_bundles import FAST_SWITCH, npy_bytes
from test_inputs import CLASS_NAMES, as_tensor, encoded, make_image_bundle, pixels

from hmt.bundle import load_bundle
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

NPY = {"content-type": "application/x-npy"}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    bundle = load_bundle(make_image_bundle(tmp_path_factory.mktemp("answers") / "bundle"))
    controller = Controller(bundle, ServeSettings.from_mapping({**FAST_SWITCH, "early_exit": {"enabled": False}}),
                            warmup_runs=1)
    controller.start(background=False)
    with TestClient(create_app(controller, ApiOptions(max_batch=8, max_image_pixels=1_000_000))) as cl:
        yield cl


def test_probabilities_and_top_k(client: TestClient) -> None:
    body = npy_bytes(as_tensor(pixels(1)))
    plain = client.post("/v1/predict", content=body, headers=NPY).json()
    assert "probabilities" not in plain and "top_k" not in plain  # only on request
    doc = client.post("/v1/predict?top_k=3&probabilities=true", content=body, headers=NPY).json()
    probs = np.array(doc["probabilities"])
    assert probs.shape == (4,) and probs.sum() == pytest.approx(1.0, abs=1e-5)
    assert doc["confidence"] == pytest.approx(probs.max(), rel=1e-6) and int(probs.argmax()) == doc["class"]
    top = doc["top_k"]
    assert [t["class"] for t in top] == list(np.argsort(-probs)[:3])
    assert [t["class_name"] for t in top] == [CLASS_NAMES[t["class"]] for t in top]
    assert top[0]["probability"] >= top[1]["probability"] >= top[2]["probability"]


def test_json_body_field(client: TestClient) -> None:
    x = as_tensor(pixels(2))
    doc = client.post("/v1/predict", json={"inputs": x.tolist(), "top_k": 2}).json()
    assert "top_k" in doc, doc
    assert len(doc["top_k"]) == 2 and doc["top_k"][0]["class"] == doc["class"]
    r = client.post("/v1/predict", json={"inputs": x.tolist(), "topk": 2})
    assert r.status_code == 422 and "topk" in r.json()["error"]["message"]


@pytest.mark.parametrize(("query", "code"), [("?top_k=0", "bad_top_k"), ("?top_k=5", "bad_top_k"),
                                             ("?top_k=two", "bad_top_k"), ("?topk=2", "unknown_parameter"),
                                             ("?probabilities=maybe", "bad_parameter")])
def test_bad_parameters_are_refused_not_ignored(client: TestClient, query: str, code: str) -> None:
    r = client.post("/v1/predict" + query, content=npy_bytes(as_tensor(pixels(1))), headers=NPY)
    assert r.status_code == 400 and r.json()["error"]["code"] == code


def test_multipart_upload(client: TestClient) -> None:
    px = [pixels(20), pixels(21)]
    single = client.post("/v1/predict", content=encoded(px[0], "PNG"), headers={"content-type": "image/png"}).json()
    r = client.post("/v1/predict", files={"file": ("cat.png", encoded(px[0], "PNG"), "image/png")},
                    data={"top_k": "2"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["class"] == single["class"] and doc["confidence"] == pytest.approx(single["confidence"], rel=1e-6)
    assert len(doc["top_k"]) == 2
    files = [("file", (f"{i}.png", encoded(p, "PNG"), "image/png")) for i, p in enumerate(px)]
    batch = client.post("/v1/predict", files=files).json()
    assert batch["batch"] == 2 and batch["predictions"][0]["class"] == single["class"]
    r = client.post("/v1/predict", data={"top_k": "2"}, files={"file": ("x.bin", b"nonsense", "image/png")})
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_bytes"
    r = client.post("/v1/predict", content=b"--x\r\n\r\n--x--", headers={"content-type": "multipart/form-data"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_multipart"
