"""hmt.client against a real server: keep-alive, encodings, errors, client-reported latency, stale reconnects."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import FAST_SWITCH, npy_bytes

from hmt.bundle import load_bundle
from hmt.client import HmtClient, ServeError
from hmt.errors import UsageError
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.server import ApiServer, ServerOptions

TOKEN = "c" * 24


@pytest.fixture(scope="module")
def server(bundle_dir: Path) -> Iterator[ApiServer]:
    controller = Controller(load_bundle(bundle_dir), ServeSettings.from_mapping(FAST_SWITCH), warmup_runs=1)
    controller.start(background=False)
    srv = ApiServer(create_app(controller, ApiOptions(token=TOKEN)), ServerOptions(port=0, keep_alive_s=1))
    srv.start_background()
    yield srv
    srv.stop_background()


def test_predict_health_status_over_one_kept_alive_connection(server: ApiServer) -> None:
    accepted = server.stats.accepted
    with HmtClient(server.url, token=TOKEN) as client:
        assert client.health() == {"live": True, "ready": True, "variant": "big"}
        doc = client.predict(np.array([[0, 9, 0, 0]], np.float32))
        assert doc["class"] == 1 and doc["variant"] == "big"
        assert client.predict(npy_bytes(np.array([8, 0, 0, 0], np.float32)))["class"] == 0  # .npy bytes
        batch = client.predict(np.eye(4, dtype=np.float32) * 9)
        assert [p["class"] for p in batch["predictions"]] == [0, 1, 2, 3]
        before = client.status()["http"]["client_latency_ms"]
        for _ in range(3):
            client.predict(np.zeros(4, np.float32))
        after = client.status()["http"]["client_latency_ms"]
        # Every predict after the first reports the previous one's latency as the client saw it.
        assert after["count"] - (before["count"] if before else 0) == 3
        assert client.last_latency_ms is not None and client.last_latency_ms > 0
    assert server.stats.accepted - accepted == 1


def test_refusals_raise_serve_error_with_the_servers_code(server: ApiServer) -> None:
    with HmtClient(server.url, token=TOKEN) as client:
        with pytest.raises(ServeError) as err:
            client.predict(np.zeros((1, 3), np.float32))
        assert err.value.status == 422 and err.value.code == "bad_shape"
        with pytest.raises(ServeError) as err:
            client.predict(b"\x89PNG\r\n\x1a\n...")
        assert err.value.status == 415
        with pytest.raises(UsageError):
            client.predict(b"plain text")
        assert client.predict(np.zeros(4, np.float32))["variant"] == "big"  # the connection survived
    with HmtClient(server.url) as anonymous, pytest.raises(ServeError) as err:
        anonymous.status()
    assert err.value.status == 401 and err.value.code == "unauthorized"
    with HmtClient("http://127.0.0.1:1") as nowhere, pytest.raises(ServeError) as err:
        nowhere.health()
    assert err.value.status is None


def test_a_connection_the_server_closed_is_reopened_once(server: ApiServer) -> None:
    with HmtClient(server.url, token=TOKEN) as client:
        client.predict(np.zeros(4, np.float32))
        accepted = server.stats.accepted
        time.sleep(1.6)  # past the server's 1 s keep-alive: it closes the idle connection
        assert client.predict(np.zeros(4, np.float32))["variant"] == "big"
        assert server.stats.accepted == accepted + 1


def test_the_client_imports_neither_torch_nor_the_server() -> None:
    import subprocess
    import sys

    code = ("import sys, hmt.client; bad = [m for m in ('torch', 'starlette', 'uvicorn', 'onnxruntime', 'numpy') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_client_latency_header_cannot_poison_the_figures(server: ApiServer) -> None:
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    body = npy_bytes(np.zeros(4, np.float32))
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-npy"}
    with HmtClient(server.url, token=TOKEN) as client:
        start = client.status()["http"]
    try:
        for fake in ("9999999", "5000", "9999999"):  # on one kept-alive connection: the 1st has no answer before
            conn.request("POST", "/v1/predict", body=body, headers=headers | {"X-HMT-Client-Latency-Ms": fake})
            assert conn.getresponse().read() and True
    finally:
        conn.close()
    with HmtClient(server.url, token=TOKEN) as client:
        http_doc = client.status()["http"]
    reports = http_doc["client_reports"]
    assert reports["refused"] - start["client_reports"]["refused"] == 3 and reports["accepted"] == \
        start["client_reports"]["accepted"]
    latency = http_doc["client_latency_ms"]
    assert latency is None or latency["p99"] < 1000 + (http_doc["request_span_ms"]["p99"] or 0)


def test_float64_paths_pil_images_and_top_k(server: ApiServer, tmp_path: Path) -> None:
    with HmtClient(server.url, token=TOKEN) as client:
        as64 = client.predict(np.array([[0, 0, 9, 0]]) * 1.0)  # numpy's default float64: sent as float32
        assert as64["class"] == 2
        path = tmp_path / "x.npy"
        np.save(path, np.array([[0, 0, 0, 9]], np.float32))
        assert client.predict(path)["class"] == 3 and client.predict(str(path))["class"] == 3
        doc = client.predict(np.array([[0, 9, 1, 0]], np.float32), top_k=2, probabilities=True)
        assert [t["class"] for t in doc["top_k"]] == [1, 2] and len(doc["probabilities"]) == 4
        with pytest.raises(UsageError, match="cannot read"):
            client.predict(tmp_path / "missing.jpg")
        with pytest.raises(UsageError, match="top_k"):
            client.predict(path, top_k=0)


def test_pil_image_is_sent_as_png() -> None:
    from PIL import Image

    from hmt.client import _encode

    image = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    body, media = _encode(image)
    assert media == "image/png" and body.startswith(b"\x89PNG")
    rgba = Image.fromarray(np.zeros((4, 4, 4), np.uint8), "RGBA")
    assert _encode(rgba)[1] == "image/png"
