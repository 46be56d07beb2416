"""The Open Inference Protocol (KServe v2) through a client nobody here wrote: tritonclient[http],
against a live server (real uvicorn, real sockets); its answers equal /v1's for the same inputs."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import time
from collections.abc import Iterator

import numpy as np
import pytest
from serve_bundles import FAST_SWITCH, npy_bytes
from test_inputs import CLASS_NAMES, as_tensor, encoded, make_image_bundle, pixels

from hmt.bundle import load_bundle
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.server import ApiServer, ServerOptions

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

TOKEN = "v2-token-" + "x" * 16
AUTH = {"Authorization": f"Bearer {TOKEN}"}  # never handed to tritonclient: its infer() adds headers to the dict


def auth() -> dict[str, str]:
    return dict(AUTH)
MODEL = "cifar-tiny"


def serve(tmp_path_factory: pytest.TempPathFactory, dynamic_batch: int = 1) -> Iterator[ApiServer]:
    bundle = load_bundle(make_image_bundle(tmp_path_factory.mktemp("oip") / "bundle"))
    controller = Controller(bundle, ServeSettings.from_mapping({**FAST_SWITCH, "early_exit": {"enabled": False}}),
                            warmup_runs=1)
    controller.start(background=False)
    app = create_app(controller, ApiOptions(token=TOKEN, model_name=MODEL, max_batch=8, max_image_pixels=1_000_000,
                                            dynamic_batch=dynamic_batch))
    api = ApiServer(app, ServerOptions(port=0, raise_fd_limit=False))
    api.start_background()
    yield api
    api.stop_background()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    yield from serve(tmp_path_factory)


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """The same bundle behind the dynamic batcher (``--dynamic-batch 4``)."""
    yield from serve(tmp_path_factory, dynamic_batch=4)


@pytest.fixture(scope="module")
def triton(server: ApiServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}")
    yield client
    client.close()


def text(values: np.ndarray) -> list[str]:
    """BYTES elements as text (tritonclient gives bytes from binary data, str from JSON)."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]


def v1(server: ApiServer, body: bytes, media: str, query: str = "") -> dict:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/v1/predict" + query, body=body, headers={**AUTH, "content-type": media})
    response = conn.getresponse()
    doc = json.loads(response.read())
    conn.close()
    assert response.status == 200, doc
    return doc  # type: ignore[no-any-return]


def raw(server: ApiServer, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict]:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    doc = json.loads(response.read())
    conn.close()
    return response.status, doc


def test_health_and_metadata(triton: httpclient.InferenceServerClient) -> None:
    assert triton.is_server_live(headers=auth()) and triton.is_server_ready(headers=auth())
    assert triton.is_model_ready(MODEL, headers=auth()) and triton.is_model_ready(MODEL, "1", headers=auth())
    assert not triton.is_model_ready("other", headers=auth())
    server_meta = triton.get_server_metadata(headers=auth())
    assert server_meta["name"] == "hmt" and "binary_tensor_data" in server_meta["extensions"]
    meta = triton.get_model_metadata(MODEL, headers=auth())
    assert meta["name"] == MODEL and meta["versions"] == ["1"]
    inputs = {t["name"]: t for t in meta["inputs"]}
    assert inputs["input"] == {"name": "input", "datatype": "FP32", "shape": [-1, 3, 8, 8]}
    assert inputs["image"]["datatype"] == "BYTES"
    outputs = {t["name"]: t for t in meta["outputs"]}
    assert outputs["probabilities"]["shape"] == [-1, 4] and outputs["class"]["datatype"] == "INT64"
    assert meta["parameters"]["variants"] == "v" and meta["parameters"]["running_variant"] == "v"


@pytest.mark.parametrize("binary", [False, True])
def test_infer_equals_v1(server: ApiServer, triton: httpclient.InferenceServerClient, binary: bool) -> None:
    batch = np.concatenate([as_tensor(pixels(s)) for s in range(3)])
    x = httpclient.InferInput("input", list(batch.shape), "FP32")
    x.set_data_from_numpy(batch, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary)
               for n in ("class", "confidence", "class_name", "probabilities")]
    result = triton.infer(MODEL, [x], outputs=outputs, headers=auth())
    reference = v1(server, npy_bytes(batch), "application/x-npy", "?probabilities=true")["predictions"]
    assert result.as_numpy("class").tolist() == [r["class"] for r in reference]
    assert text(result.as_numpy("class_name")) == [r["class_name"] for r in reference]
    np.testing.assert_allclose(result.as_numpy("confidence"), [r["confidence"] for r in reference], rtol=1e-6)
    probs = result.as_numpy("probabilities")
    assert probs.shape == (3, 4)
    np.testing.assert_allclose(probs, [r["probabilities"] for r in reference], rtol=1e-6)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert len({r["class"] for r in reference}) > 1 or probs.std() > 0  # depends on the input


def test_default_outputs_binary_and_image_bytes(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    px = [pixels(10 + s) for s in range(2)]
    images = np.array([encoded(p, "PNG") for p in px], dtype=object)
    x = httpclient.InferInput("image", [2], "BYTES")
    x.set_data_from_numpy(images)  # the binary-data extension (tritonclient's default)
    result = triton.infer(MODEL, [x], headers=auth())  # no outputs named: every default output, binary
    reference = [v1(server, encoded(p, "PNG"), "image/png") for p in px]
    assert result.as_numpy("class").tolist() == [r["class"] for r in reference]
    assert text(result.as_numpy("variant")) == ["v", "v"]
    assert result.get_output("probabilities") is None  # probabilities only on request
    # Raw uint8 pixels as a BYTES element go through the same preprocessing.
    y = httpclient.InferInput("image", [1], "BYTES")
    y.set_data_from_numpy(np.array([px[0].tobytes()], dtype=object))
    assert triton.infer(MODEL, [y], headers=auth()).as_numpy("class").tolist() == [reference[0]["class"]]


def test_top_k_and_classification(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    batch = as_tensor(pixels(3))
    x = httpclient.InferInput("input", list(batch.shape), "FP32")
    x.set_data_from_numpy(batch)
    result = triton.infer(MODEL, [x], headers=auth(), parameters={"top_k": 2})
    reference = v1(server, npy_bytes(batch), "application/x-npy", "?top_k=2")
    assert result.as_numpy("top_k_classes").tolist() == [[t["class"] for t in reference["top_k"]]]
    np.testing.assert_allclose(result.as_numpy("top_k_probabilities")[0],
                               [t["probability"] for t in reference["top_k"]], rtol=1e-6)
    assert reference["top_k"][0]["class"] == reference["class"]
    assert reference["top_k"][0]["class_name"] in CLASS_NAMES
    triton_style = triton.infer(MODEL, [x], headers=auth(),
                                outputs=[httpclient.InferRequestedOutput("probabilities", class_count=2)])
    first = text(triton_style.as_numpy("probabilities"))[0].split(":")
    assert int(first[1]) == reference["class"] and first[2] == reference["class_name"]


def test_json_bytes_are_base64(server: ApiServer) -> None:
    png = encoded(pixels(5), "PNG")
    body = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                   "data": [base64.b64encode(png).decode()]}]}).encode()
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", body, {**AUTH, "content-type": "application/json"})
    assert status == 200 and doc["model_name"] == MODEL, doc
    outputs = {o["name"]: o for o in doc["outputs"]}
    assert outputs["class"]["data"] == [v1(server, png, "image/png")["class"]]


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{", 400, "not valid JSON"),
    (json.dumps({"inputs": [{"name": "nope", "shape": [1], "datatype": "FP32", "data": [1]}]}), 400, "unknown input"),
    (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [1]}]}), 400,
     "elements for shape"),
    (json.dumps({"inputs": [{"name": "input", "shape": [2], "datatype": "FP64", "data": [1, 2]}]}), 422,
     "dtype"),
    (json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": ["%%"]}]}), 400, "base64"),
    (json.dumps({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}],
                 "parameters": {"top_kk": 3}}), 400, "top_kk"),
    (json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0] * 192}],
                 "parameters": {"top_k": 9}}), 400, "top_k"),
])
def test_v2_error_body(server: ApiServer, body: bytes | str, status: int, words: str) -> None:
    got, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", body.encode() if isinstance(body, str) else body,
                   {**AUTH, "content-type": "application/json"})
    assert got == status and set(doc) == {"error"} and isinstance(doc["error"], str), doc
    assert words in doc["error"]


def test_v2_errors_reach_tritonclient(triton: httpclient.InferenceServerClient) -> None:
    x = httpclient.InferInput("input", [1, 3, 8, 8], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(InferenceServerException, match="unknown model"):
        triton.infer("missing", [x], headers=auth())
    with pytest.raises(InferenceServerException, match="unknown output"):
        triton.infer(MODEL, [x], headers=auth(), outputs=[httpclient.InferRequestedOutput("logits")])


def test_token_guards_v2(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    for path in ("/v2", "/v2/health/ready", f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/infer"):
        status, doc = raw(server, "GET", path, headers={"Authorization": "Bearer wrong-token-xxxxxxxxxx"})
        assert status == 401 and doc == {"error": "missing or wrong bearer token"}
    assert not triton.is_server_live()  # no token: refused
    with pytest.raises(InferenceServerException, match="bearer token"):
        triton.get_model_metadata(MODEL)
    status, doc = raw(server, "GET", "/v2/nothing", headers=auth())
    assert status == 404 and isinstance(doc["error"], str)


def infer_with(server: ApiServer, parameters: dict[str, object]) -> tuple[int, dict]:  # type: ignore[type-arg]
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                   "data": [0] * 192}], "parameters": parameters}).encode()
    return raw(server, "POST", f"/v2/models/{MODEL}/infer", body, {**AUTH, "content-type": "application/json"})


def test_timeout_parameter_and_queue_slots(batching_server: ApiServer) -> None:
    """/v2 bodies are parsed after admission (in the decoding lane): with the dynamic batcher on,
    the request's own timeout parameter applies once parsed, as the model configuration's queue
    policy says, and a refused body gives its queue slot back."""
    server = batching_server
    config = raw(server, "GET", f"/v2/models/{MODEL}/config", headers=auth())[1]
    assert config["dynamic_batching"]["default_queue_policy"]["allow_timeout_override"] is True
    assert infer_with(server, {"timeout": 10_000_000})[0] == 200
    status, doc = infer_with(server, {"timeout": -5})
    assert status == 400 and "timeout" in doc["error"], doc
    status, doc = infer_with(server, {"timeout": 1})  # 1 us: over before the inference can start
    assert status == 504 and "deadline" in doc["error"], doc
    for _ in range(50):  # a dropped job gives its slot back when the pool reaches it
        status, doc = raw(server, "GET", "/v1/status", headers=auth())
        if doc["queue"]["admitted"] == 0:
            break
        time.sleep(0.05)
    assert status == 200 and doc["queue"]["admitted"] == 0 and doc["queue"]["deadline_expired"] >= 1


def test_timeout_parameter_without_dynamic_batching(server: ApiServer) -> None:
    """Triton respects a request's timeout only for a model configured with dynamic batching and
    ignores it elsewhere, so clients send it carelessly (tritony: ``timeout=30``, meant as seconds,
    on every request). Without the batcher it is checked and ignored; X-Deadline-Ms still applies."""
    assert "dynamic_batching" not in raw(server, "GET", f"/v2/models/{MODEL}/config", headers=auth())[1]
    status, doc = infer_with(server, {"timeout": 30})
    assert status == 200 and doc["model_name"] == MODEL, doc
    assert infer_with(server, {"timeout": "30"})[0] == 400


def test_kserve_client_request_keys(server: ApiServer) -> None:
    """KServe's Python client (InferenceRESTClient, via InferRequest.to_rest) writes ``model_name``
    into every request body, JSON or binary; the path names the model, so it is accepted, not refused."""
    tensor = as_tensor(pixels(4))
    data = {"name": "input", "shape": list(tensor.shape), "datatype": "FP32", "data": tensor.reshape(-1).tolist()}
    body = json.dumps({"id": "7f0c-kserve", "model_name": MODEL, "inputs": [data]}).encode()
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", body, {**AUTH, "content-type": "application/json"})
    assert status == 200 and doc["id"] == "7f0c-kserve" and doc["model_name"] == MODEL, doc
    reference = v1(server, npy_bytes(tensor), "application/x-npy")
    assert {o["name"]: o["data"] for o in doc["outputs"]}["class"] == [reference["class"]]
    header = json.dumps({"id": "k2", "model_name": None, "inputs": [{
        "name": "input", "shape": list(tensor.shape), "datatype": "FP32",
        "parameters": {"binary_data_size": tensor.nbytes}}]}).encode()
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", header + tensor.tobytes(),
                      {**AUTH, "content-type": "application/octet-stream",
                       "Inference-Header-Content-Length": str(len(header))})
    assert status == 200 and doc["id"] == "k2", doc
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer",
                      json.dumps({"model_name": 5, "inputs": [data]}).encode(), {**AUTH})
    assert status == 400 and "model_name" in doc["error"], doc


def test_compressed_requests(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    """tritonclient's ``request_compression_algorithm`` sends the body gzip- or zlib-compressed
    (``Content-Encoding: gzip`` / ``deflate``, the JSON header's length counted before compression);
    each gives the uncompressed answer, and an inflated body is held to the body bound."""
    batch = np.concatenate([as_tensor(pixels(20 + s)) for s in range(2)])
    x = httpclient.InferInput("input", list(batch.shape), "FP32")
    x.set_data_from_numpy(batch)
    plain = triton.infer(MODEL, [x], headers=auth()).as_numpy("class").tolist()
    for algorithm in ("gzip", "deflate"):
        result = triton.infer(MODEL, [x], headers=auth(), request_compression_algorithm=algorithm)
        assert result.as_numpy("class").tolist() == plain
    y = httpclient.InferInput("input", list(batch.shape), "FP32")
    y.set_data_from_numpy(batch, binary_data=False)
    assert triton.infer(MODEL, [y], headers=auth(), request_compression_algorithm="gzip",
                        ).as_numpy("class").tolist() == plain
    bomb = gzip.compress(b" " * (4 << 20))  # 4 MiB of JSON whitespace in a few KiB
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", bomb, {**AUTH, "content-encoding": "gzip"})
    assert status == 413 and "inflates" in doc["error"], doc
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", b"\x1f\x8b not gzip", {
        **AUTH, "content-encoding": "gzip"})
    assert status == 400 and "gzip" in doc["error"], doc
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", b"{}", {**AUTH, "content-encoding": "br"})
    assert status == 415 and "gzip" in doc["error"], doc


@pytest.mark.parametrize("binary", [False, True])
def test_every_listed_output_can_be_asked_for(triton: httpclient.InferenceServerClient, binary: bool) -> None:
    """A generic client asks for every output the metadata lists (PyTriton's ModelClient asks for
    every configured one): each comes back with the listed datatype and a shape the listed one
    allows, the top-k outputs included (k = 5 at most, without the request parameter top_k)."""
    meta = triton.get_model_metadata(MODEL, headers=auth())
    batch = np.concatenate([as_tensor(pixels(30 + s)) for s in range(2)])
    x = httpclient.InferInput("input", list(batch.shape), "FP32")
    x.set_data_from_numpy(batch, binary_data=binary)
    asked = [httpclient.InferRequestedOutput(o["name"], binary_data=binary) for o in meta["outputs"]]
    result = triton.infer(MODEL, [x], outputs=asked, headers=auth())
    for listed in meta["outputs"]:
        got = result.get_output(listed["name"])
        assert got is not None and got["datatype"] == listed["datatype"], listed
        assert got["shape"][0] == 2
        assert all(want in (-1, have) for want, have in zip(listed["shape"], got["shape"], strict=True)), (listed, got)
    classes = result.as_numpy("top_k_classes")
    assert classes.shape == (2, 4)  # min(5, the bundle's 4 classes)
    assert classes[:, 0].tolist() == result.as_numpy("class").tolist()


def test_model_configuration(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    """Triton's model configuration extension (``get_model_config``): what Triton's examples and
    PyTriton's ModelClient read before inferring (max_batch_size, input and output: TYPE_ data
    types, non-empty dims without the batch axis); they agree with the metadata."""
    assert "model_configuration" in triton.get_server_metadata(headers=auth())["extensions"]
    config = triton.get_model_config(MODEL, headers=auth())
    assert config == triton.get_model_config(MODEL, "1", headers=auth())
    assert config["name"] == MODEL and config["max_batch_size"] == 8
    meta = triton.get_model_metadata(MODEL, headers=auth())
    for kind, listed in (("input", meta["inputs"]), ("output", meta["outputs"])):
        assert [t["name"] for t in config[kind]] == [t["name"] for t in listed]
        for tensor, described in zip(config[kind], listed, strict=True):
            prefix, datatype = tensor["data_type"].split("_")
            assert prefix == "TYPE" and datatype == {"BYTES": "STRING"}.get(described["datatype"],
                                                                            described["datatype"])
            assert tensor["dims"] and all(type(d) is int for d in tensor["dims"])
            assert described["shape"][1:] == tensor.get("reshape", {"shape": tensor["dims"]})["shape"]
    inputs = {t["name"]: t for t in config["input"]}
    assert inputs["input"]["dims"] == [3, 8, 8] and inputs["input"]["format"] == "FORMAT_NCHW"
    assert inputs["image"]["dims"] == [1] and inputs["image"]["reshape"] == {"shape": []}
    assert all(t["optional"] for t in config["input"])  # one of them per request
    assert {t["name"]: t["dims"] for t in config["output"]}["probabilities"] == [4]
    assert config["parameters"]["running_variant"] == {"string_value": "v"}
    with pytest.raises(InferenceServerException, match="unknown model"):
        triton.get_model_config("missing", headers=auth())


def test_inference_statistics(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    """Triton's statistics extension (``get_inference_statistics``, with and without a model): the
    counts move with each answered and each failed inference, on either protocol."""
    assert "statistics" in triton.get_server_metadata(headers=auth())["extensions"]

    def stat() -> dict:  # type: ignore[type-arg]
        doc = triton.get_inference_statistics(MODEL, headers=auth())
        assert doc == triton.get_inference_statistics(MODEL, "1", headers=auth())
        assert [s["name"] for s in triton.get_inference_statistics(headers=auth())["model_stats"]] == [MODEL]
        (only,) = doc["model_stats"]
        return only  # type: ignore[no-any-return]

    before = stat()
    assert before["version"] == "1"
    batch = np.concatenate([as_tensor(pixels(40 + s)) for s in range(3)])
    x = httpclient.InferInput("input", list(batch.shape), "FP32")
    x.set_data_from_numpy(batch)
    triton.infer(MODEL, [x], headers=auth())
    v1(server, npy_bytes(batch[:1]), "application/x-npy")
    bad = httpclient.InferInput("input", [1, 3, 8, 8], "FP32")
    bad.set_data_from_numpy(np.full((1, 3, 8, 8), 3e38, np.float32))  # finite, but no finite answer: 422
    with pytest.raises(InferenceServerException):
        triton.infer(MODEL, [bad], headers=auth())
    after = stat()
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] == after["inference_count"]
    stats, was = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - was["success"]["count"] == 2
    assert stats["success"]["ns"] > was["success"]["ns"]
    assert stats["fail"]["count"] - was["fail"]["count"] == 1
    # queue and compute count requests, as Triton's do (the 3-input request is one), executions count inputs
    assert stats["compute_infer"]["count"] == stats["queue"]["count"] == stats["success"]["count"]
    assert stats["compute_infer"]["ns"] > 0
    assert sum(b["compute_infer"]["count"] for b in after["batch_stats"]) == after["execution_count"]
    assert abs(after["last_inference"] / 1e3 - time.time()) < 60
    with pytest.raises(InferenceServerException, match="unknown model"):
        triton.get_inference_statistics("missing", headers=auth())


@pytest.mark.parametrize(("extra", "words"), [
    ({"parameters": {"top_k": 0}}, "top_k"),
    ({"outputs": [{"name": "logits"}]}, "unknown output"),
    ({"outputs": [{"name": "class", "parameters": {"classification": 2}}]}, "classification"),
])
def test_bad_outputs_are_refused_before_the_inputs_run(server: ApiServer, triton: httpclient.InferenceServerClient,
                                                       extra: dict, words: str) -> None:  # type: ignore[type-arg]
    """A request refused for its outputs or top_k is refused before inference: not counted as answered
    (as /v1 refuses a bad top_k before its inputs run)."""
    before = triton.get_inference_statistics(MODEL, headers=auth())["model_stats"][0]
    body = json.dumps({"inputs": [{"name": "input", "shape": [2, 3, 8, 8], "datatype": "FP32",
                                   "data": [0] * 384}], **extra}).encode()
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", body, {**AUTH, "content-type": "application/json"})
    assert status == 400 and words in doc["error"], doc
    after = triton.get_inference_statistics(MODEL, headers=auth())["model_stats"][0]
    assert after["inference_count"] == before["inference_count"]
    assert after["inference_stats"]["success"] == before["inference_stats"]["success"]


def test_client_hints_are_accepted(server: ApiServer, triton: httpclient.InferenceServerClient) -> None:
    """Parameters common clients send that change nothing here: tritonclient's ``priority`` (one
    priority level) and the ``content_type`` codec hint MLServer's codecs write on a request and on
    each input. Typed, they are accepted; a sequence (state this model does not keep) is still refused."""
    tensor = as_tensor(pixels(6))
    x = httpclient.InferInput("input", list(tensor.shape), "FP32")
    x.set_data_from_numpy(tensor)
    reference = v1(server, npy_bytes(tensor), "application/x-npy")["class"]
    assert triton.infer(MODEL, [x], headers=auth(), priority=3).as_numpy("class").tolist() == [reference]
    body = json.dumps({"parameters": {"content_type": "np"}, "inputs": [{
        "name": "input", "shape": list(tensor.shape), "datatype": "FP32", "parameters": {"content_type": "np"},
        "data": tensor.reshape(-1).tolist()}]}).encode()
    status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer", body, {**AUTH, "content-type": "application/json"})
    assert status == 200 and {o["name"]: o["data"] for o in doc["outputs"]}["class"] == [reference], doc
    for bad in ({"priority": -1}, {"priority": "high"}, {"content_type": 7}):
        status, doc = raw(server, "POST", f"/v2/models/{MODEL}/infer",
                          json.dumps({**json.loads(body), "parameters": bad}).encode(), AUTH)
        assert status == 400 and next(iter(bad)) in doc["error"], doc
    with pytest.raises(InferenceServerException, match="sequence_id"):
        triton.infer(MODEL, [x], headers=auth(), sequence_id=7)


def infer_bytes(server: ApiServer, body: bytes) -> tuple[dict, bytes]:  # type: ignore[type-arg]
    """A /v2 inference's JSON header and the binary bytes after it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", f"/v2/models/{MODEL}/infer", body=body, headers=AUTH)
    response = conn.getresponse()
    content = response.read()
    conn.close()
    assert response.status == 200, content
    size = int(response.getheader("Inference-Header-Content-Length", len(content)))
    return json.loads(content[:size]), content[size:]


def test_output_binary_data_overrides_the_request(server: ApiServer) -> None:
    """An output's own ``binary_data`` overrides the request's ``binary_data_output`` either way
    (Triton's binary-data extension; KServe's client documents the same): JSON where the output
    says false, binary where it says true, the request's choice where it says nothing."""
    tensor = as_tensor(pixels(8))
    data = {"name": "input", "shape": list(tensor.shape), "datatype": "FP32", "data": tensor.reshape(-1).tolist()}
    header, binary = infer_bytes(server, json.dumps({
        "parameters": {"binary_data_output": True}, "inputs": [data],
        "outputs": [{"name": "class", "parameters": {"binary_data": False}}, {"name": "confidence"}]}).encode())
    outputs = {o["name"]: o for o in header["outputs"]}
    assert outputs["class"]["data"] == [v1(server, npy_bytes(tensor), "application/x-npy")["class"]]
    assert outputs["confidence"]["parameters"] == {"binary_data_size": 4} and len(binary) == 4
    header, binary = infer_bytes(server, json.dumps({
        "parameters": {"binary_data_output": False}, "inputs": [data],
        "outputs": [{"name": "class", "parameters": {"binary_data": True}}]}).encode())
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 8} and len(binary) == 8
