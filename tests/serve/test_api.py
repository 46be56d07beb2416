"""The HTTP contract: every endpoint, auth, refusals with clear JSON errors, queue, deadline."""

from __future__ import annotations

import http.client
import json
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serve_bundles import FAST_SWITCH, VariantDef, make_bundle, npy_bytes, sleepy_loader

from hmt.bundle import load_bundle
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.server import ApiServer, ServerOptions

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

TOKEN = "t" * 24
NPY = {"content-type": "application/x-npy"}


def make_controller(bundle_dir: Path, sleep_s: float | None = None, start: bool = True) -> Controller:
    bundle = load_bundle(bundle_dir)
    c = Controller(bundle, ServeSettings.from_mapping(FAST_SWITCH), warmup_runs=1,
                   loader=None if sleep_s is None else sleepy_loader(bundle, sleep_s))
    if start:
        c.start(background=False)
    return c


@pytest.fixture(scope="module")
def client(bundle_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_controller(bundle_dir))) as cl:
        yield cl


def error_code(response: object) -> str:
    doc = response.json()  # type: ignore[attr-defined]
    assert set(doc) == {"error"} and doc["error"]["message"]
    return str(doc["error"]["code"])


def test_predict_npy_and_json(client: TestClient) -> None:
    r = client.post("/v1/predict", content=npy_bytes(np.array([[0, 9, 0, 0]], np.float32)), headers=NPY)
    assert r.status_code == 200
    doc = r.json()
    assert doc["class"] == 1 and doc["exit"] == 0 and doc["variant"] == "big" and doc["confidence"] > 0.99
    assert doc["latency_ms"] >= doc["compute_ms"] > 0
    r = client.post("/v1/predict", json={"inputs": [0, 0, 0, 0]})  # no batch axis: accepted
    assert r.status_code == 200 and r.json()["exit"] == 1


@pytest.mark.parametrize(("content", "headers", "status", "code"), [
    (b"", NPY, 400, "empty_body"),
    (b"not npy", NPY, 400, "bad_npy"),
    (npy_bytes(np.zeros((1, 3), np.float32)), NPY, 422, "bad_shape"),
    (npy_bytes(np.zeros((2, 3), np.float32)), NPY, 422, "bad_shape"),
    (npy_bytes(np.zeros((1, 1, 4), np.float32)), NPY, 422, "bad_shape"),
    (npy_bytes(np.zeros((1, 4), np.float64)), NPY, 422, "bad_dtype"),
    (npy_bytes(np.array([[0, np.nan, 0, 0]], np.float32)), NPY, 422, "non_finite"),
    (npy_bytes(np.array([[0, np.inf, 0, 0]], np.float32)), NPY, 422, "non_finite"),
    (b'{"inputs": [0, NaN, 0, 0]}', {"content-type": "application/json"}, 422, "non_finite"),
    (b'{"inputs": [1e999, 0, 0, 0]}', {"content-type": "application/json"}, 422, "non_finite"),
    (b'{"inputs": [[0, 1], [0]]}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b'{"x": [0, 0, 0, 0]}', {"content-type": "application/json"}, 422, "bad_json"),
    (b'{"inputs": [0, 0, 0, "a"]}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b"{", {"content-type": "application/json"}, 400, "bad_json"),
    # issue 17, defects 6 and 10: each of these was a 500 or was accepted
    (b'{"inputs": ' + b"[" * 5000 + b"0" + b"]" * 5000 + b"}", {"content-type": "application/json"}, 400, "bad_json"),
    (b'{"inputs": [' + b"9" * 400 + b', 0, 0, 0]}', {"content-type": "application/json"}, 422, "bad_number"),
    (b'{"inputs": [1e39, 0, 0, 0]}', {"content-type": "application/json"}, 422, "bad_number"),
    (b'{"inputs": [true, 0, 0, 0]}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b'{"inputs": ["1.5", 0, 0, 0]}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b'{"inputs": null}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b'{"inputs": [0, null, 0, 0]}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b'{"inputs": 5}', {"content-type": "application/json"}, 422, "bad_inputs"),
    (b"0,0,0,0", {"content-type": "text/csv"}, 415, "unsupported_media_type"),
    (b"0" * (2 << 20), NPY, 413, "body_too_large"),
    (b"\x89PNG\r\n\x1a\n", {"content-type": "image/png"}, 415, "not_an_image_model"),
])
def test_bad_requests_get_clear_errors(client: TestClient, content: bytes, headers: dict[str, str], status: int,
                                       code: str) -> None:
    r = client.post("/v1/predict", content=content, headers=headers)
    assert r.status_code == status and error_code(r) == code
    assert "Error" not in r.json()["error"]["message"]  # a plain message, no exception names
    assert client.get("/v1/health/live").status_code == 200  # still alive


def test_streamed_body_is_bounded_without_content_length(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"0" * 65536

    r = client.post("/v1/predict", content=chunks(), headers=NPY)
    assert r.status_code == 413 and error_code(r) == "body_too_large"


def _served_routes(app: Any) -> set[tuple[str, str]]:
    """(path, method) of every route of the serve app, found below its middleware layers."""
    while not hasattr(app, "routes"):
        app = app.app
    return {(route.path, method) for route in app.routes for method in (route.methods or ()) if method != "HEAD"}


def test_health_status_metrics_openapi(client: TestClient) -> None:
    assert client.get("/v1/health/live").json() == {"status": "live"}
    assert client.get("/v1/health/ready").json()["status"] == "ready"
    status = client.get("/v1/status").json()
    assert status["variant"] == "big" and status["ready"] and "load_index" in status and "last_decisions" in status
    assert set(status["budgets"]) == {"latency_ms", "memory_mb"} and status["queue"]["max_queue"] == 64
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for name in ("hmt_http_requests_total", "hmt_predictions_total", "hmt_exits_total",
                 "hmt_inference_duration_seconds_count", "hmt_ready 1.0", 'hmt_running_variant{variant="big"} 1.0',
                 "hmt_queue_depth", "process_cpu_seconds_total"):
        assert name in text
    for line in text.splitlines():  # every sample line is "name{labels} value"
        if not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    # Every route the app serves is documented with its methods, and nothing else is (the v2 routes
    # were missing); the document's path parameters are named as the protocol names them.
    served = _served_routes(client.app)
    documented = {(path.replace("{model_name}", "{model}").replace("{model_version}", "{version}"),
                   method.upper()) for path, item in doc["paths"].items() for method in item}
    assert documented == served and ("/v2/models/{model}/infer", "POST") in served
    infer = doc["paths"]["/v2/models/{model_name}/infer"]["post"]
    assert infer["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/V2Error")
    assert error_code(client.get("/nope")) == "not_found"
    long_path = "/" + "x" * 60_000  # echoed whole before: a 60 kB error body for one wrong path
    for path in (long_path, "/v2" + long_path):
        answer = client.get(path)
        assert answer.status_code == 404 and len(answer.content) < 1_000 and f"({len(path)} characters)" in answer.text
    assert error_code(client.get("/v1/predict")) == "method_not_allowed"


def test_not_ready_answers_503(bundle_dir: Path) -> None:
    with TestClient(create_app(make_controller(bundle_dir, start=False))) as cl:
        assert cl.get("/v1/health/live").status_code == 200
        r = cl.get("/v1/health/ready")
        assert r.status_code == 503 and error_code(r) == "not_ready"
        r = cl.post("/v1/predict", json={"inputs": [0, 0, 0, 0]})
        assert r.status_code == 503 and error_code(r) == "not_ready"


def test_token_is_checked_on_every_path(bundle_dir: Path) -> None:
    app = create_app(make_controller(bundle_dir), ApiOptions(token=TOKEN))
    with TestClient(app) as cl:
        for path in ("/v1/health/live", "/v1/health/ready", "/v1/status", "/metrics", "/openapi.json"):
            r = cl.get(path)
            assert r.status_code == 401 and error_code(r) == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
            assert cl.get(path, headers={"Authorization": "Bearer " + "x" * 24}).status_code == 401
            assert cl.get(path, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
            assert cl.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        r = cl.post("/v1/predict", json={"inputs": [0, 0, 0, 0]})
        assert r.status_code == 401
        r = cl.post("/v1/predict", json={"inputs": [0, 0, 0, 0]}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        assert cl.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()["security"]


def _post(port: int, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/predict", body=npy_bytes(np.zeros((1, 4), np.float32)),
                     headers={**NPY, **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _parallel(port: int, n: int, headers: dict[str, str] | None = None) -> list[int]:
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        status, _ = _post(port, headers)
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(statuses)


def test_queue_full_429_and_deadline_504_over_real_http(bundle_dir: Path) -> None:
    controller = make_controller(bundle_dir, sleep_s=0.3)
    app = create_app(controller, ApiOptions(max_queue=2, workers=1, deadline_ms=5000))
    server = ApiServer(app, ServerOptions(port=0))
    server.start_background()
    try:
        statuses = _parallel(server.port, 4)
        assert statuses.count(200) >= 2 and statuses.count(429) >= 1 and set(statuses) <= {200, 429}
        # One worker, 0.3 s per request: the second of two waits past a 0.45 s deadline.
        statuses = _parallel(server.port, 2, {"X-Deadline-Ms": "450"})
        assert statuses == [200, 504]
        status, doc = _post(server.port, {"X-Deadline-Ms": "-1"})
        assert status == 400 and doc["error"]["code"] == "bad_deadline"  # type: ignore[index]
        status, _ = _post(server.port)
        assert status == 200  # the server is fine afterwards, and the queue drained
    finally:
        server.stop_background()


# -- issue 17 (defects 6 and 10) and issue 14 item 2 --------------------------------------------


def test_no_slash_redirect_and_405_carries_allow(client: TestClient) -> None:
    r = client.get("/v1/status/", headers={"Host": "evil.example"}, follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers and error_code(r) == "not_found"
    r = client.request("TRACE", "/v1/status")
    assert r.status_code == 405 and error_code(r) == "method_not_allowed"
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
    r = client.delete("/v1/predict")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_health_without_token_flag_opens_only_health(bundle_dir: Path) -> None:
    app = create_app(make_controller(bundle_dir), ApiOptions(token=TOKEN, health_without_token=True))
    with TestClient(app) as cl:
        assert cl.get("/v1/health/live").status_code == 200
        assert cl.get("/v1/health/ready").status_code == 200
        for path in ("/v1/status", "/metrics", "/openapi.json", "/v1/health"):
            assert cl.get(path).status_code == 401
        assert cl.post("/v1/predict", json={"inputs": [0, 0, 0, 0]}).status_code == 401


def test_a_500_never_echoes_the_exception(bundle_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    controller = make_controller(bundle_dir)

    def broken(last: int = 10) -> dict[str, object]:
        raise RuntimeError("secret /etc/internal/path")

    controller.status = broken  # type: ignore[method-assign]
    with TestClient(create_app(controller)) as cl:
        r = cl.get("/v1/status")
    assert r.status_code == 500 and error_code(r) == "internal_error"
    assert "secret" not in r.text and "RuntimeError" not in r.text
    incident = r.json()["error"]["message"].split("id ")[1].split(")")[0]
    assert any(incident in rec.getMessage() for rec in caplog.records)  # the log has it, under the same id


def test_finite_inputs_with_non_finite_logits_are_a_422(tmp_path: Path) -> None:
    # slow_n's ReduceSum of 3e38s overflows to inf, and inf * 0 gives NaN logits.
    bundle = make_bundle(tmp_path / "overflow", [VariantDef("v", 0.9, 1.0, 1.0, slow_n=2)])
    with TestClient(create_app(make_controller(bundle))) as cl:
        r = cl.post("/v1/predict", json={"inputs": [3e38, 3e38, 3e38, 3e38]})
        assert r.status_code == 422 and error_code(r) == "input_out_of_range"
        assert "3e+38" in r.json()["error"]["message"] and "ModelError" not in r.text
        assert cl.post("/v1/predict", json={"inputs": [1, 0, 0, 0]}).status_code == 200


def _slow_post(port: int, pause_s: float, headers: str = "") -> dict[str, object]:
    """A request whose body arrives ``pause_s`` after its headers (a slow upload)."""
    import socket

    body = npy_bytes(np.zeros((1, 4), np.float32))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST /v1/predict HTTP/1.1\r\nHost: x\r\ncontent-type: application/x-npy\r\n{headers}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(pause_s)
        sock.sendall(body[10:])
        data = b""
        while not data.endswith(b"}"):
            data += sock.recv(65536)
    return json.loads(data.split(b"\r\n\r\n", 1)[1])  # type: ignore[no-any-return]


def test_latency_counts_queueing_not_receipt(bundle_dir: Path) -> None:
    controller = make_controller(bundle_dir, sleep_s=0.25)
    seen: list[tuple[float, float | None]] = []
    controller.observe_request = lambda span_ms, client_ms: seen.append((span_ms, client_ms))  # type: ignore[attr-defined]
    app = create_app(controller, ApiOptions(workers=1, deadline_ms=10000))
    server = ApiServer(app, ServerOptions(port=0))
    server.start_background()
    try:
        # Receipt: the body comes 0.3 s after the headers; compute is ~0.25 s. The slow sender's pace
        # is not the server's overhead (the span below still has it).
        doc = _slow_post(server.port, 0.3, headers="X-HMT-Client-Latency-Ms: 12.5\r\n")
        assert doc["compute_ms"] - 1 <= doc["latency_ms"] < 300 + doc["compute_ms"] - 50  # type: ignore[operator]
        # Queueing: two at once on one worker; the second waits for the first's ~0.25 s.
        latencies = [_post(server.port)[1]["latency_ms"]]  # alone: about its compute
        statuses: list[float] = []
        threads = [threading.Thread(target=lambda: statuses.append(_post(server.port)[1]["latency_ms"]))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert max(statuses) >= 2 * 250 - 20, (latencies, statuses)
        status = json.loads(_get_json(server.port, "/v1/status"))
        span = status["http"]["request_span_ms"]
        assert span["count"] == 4 and span["p95"] >= 500 and span["p99"] >= 300 + doc["compute_ms"] - 5
        # 12.5 ms on a fresh connection describes no answer of this server: refused (counted, not used).
        assert status["http"]["client_latency_ms"] is None and status["http"]["client_reports"]["refused"] == 1
        assert len(seen) == 4 and seen[0][1] is None and seen[0][0] >= doc["latency_ms"]  # type: ignore[operator]
        metrics = _get_json(server.port, "/metrics")
        assert 'hmt_request_duration_seconds_count{protocol="v1"} 4.0' in metrics
        assert "hmt_client_reported_latency_seconds_count 0.0" in metrics
        assert 'hmt_client_latency_reports_total{outcome="refused"} 1.0' in metrics
        assert 'hmt_connection_events_total{event="accepted"}' in metrics
        status_code, err = _post(server.port, {"X-HMT-Client-Latency-Ms": "soon"})
        assert status_code == 400 and err["error"]["code"] == "bad_client_latency"  # type: ignore[index]
    finally:
        server.stop_background()


def _get_json(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_a_body_cut_at_the_receipt_deadline_is_a_408_not_a_logged_500(bundle_dir: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import socket

    server = ApiServer(create_app(make_controller(bundle_dir)), ServerOptions(port=0, receipt_timeout_s=0.5))
    server.start_background()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\ncontent-type: application/x-npy\r\n"
                         b"Content-Length: 200\r\n\r\n\x93NUMPY")
            reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 408")
        time.sleep(0.2)
        assert _post(server.port)[0] == 200
    finally:
        server.stop_background()
    assert not [r for r in caplog.records if "internal error" in r.getMessage()]
