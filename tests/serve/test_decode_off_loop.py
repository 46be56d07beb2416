"""Decoding runs on the pool, after admission: the event loop stays free, and a flood of bodies meets
the queue limit before it costs any decoding. A .npy header cannot claim more than its body carries."""

from __future__ import annotations

import http.client
import io
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import npy_bytes
from test_api import make_controller

import hmt.serve.http.bodies as bodies_module
from hmt.bundle import TensorSpec
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.inputs import ApiError, InputSpec, decode
from hmt.serve.http.server import ApiServer, ServerOptions

NPY = {"content-type": "application/x-npy"}


def _request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.monotonic()
    try:
        conn.request(method, path, body=body, headers=NPY if body is not None else {})
        response = conn.getresponse()
        response.read()
        return response.status, (time.monotonic() - start) * 1e3
    finally:
        conn.close()


def test_a_slow_decode_neither_blocks_the_loop_nor_escapes_the_queue(bundle_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = bodies_module.decode
    loop_threads: list[str] = []

    def slow_decode(*args: object, **kwargs: object) -> np.ndarray:
        loop_threads.append(threading.current_thread().name)
        time.sleep(0.6)  # a decode that takes long (a big PNG, a 1 MiB JSON body)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bodies_module, "decode", slow_decode)
    server = ApiServer(create_app(make_controller(bundle_dir), ApiOptions(workers=1, max_queue=1)),
                       ServerOptions(port=0))
    server.start_background()
    try:
        body = npy_bytes(np.zeros((1, 4), np.float32))
        results: list[tuple[int, float]] = []
        first = threading.Thread(target=lambda: results.append(_request(server.port, "POST", "/v1/predict", body)))
        first.start()
        time.sleep(0.15)  # the first request is decoding now
        live_status, live_ms = _request(server.port, "GET", "/v1/health/live")
        second_status, _ = _request(server.port, "POST", "/v1/predict", body)
        first.join()
        assert live_status == 200 and live_ms < 300, live_ms  # the loop answered during the decode
        assert second_status == 429  # the decoding request holds the queue's one slot
        assert results[0][0] == 200
        assert loop_threads and all(name.startswith("hmt-infer") for name in loop_threads), loop_threads
    finally:
        server.stop_background()


def _npy_claiming(shape: tuple[int, ...], payload: bytes) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buffer.getvalue() + payload


def test_an_npy_header_claiming_a_huge_shape_is_refused_before_any_allocation() -> None:
    inputs = InputSpec(TensorSpec("x", (1, 4), "float32"), preprocess=None, max_batch=4)
    body = _npy_claiming((1 << 31, 1), b"\0" * 16)  # 8 GiB claimed, 16 bytes carried
    tracemalloc.start()
    try:
        with pytest.raises(ApiError) as info:
            decode(body, "application/x-npy", inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.status == 400 and "claims shape" in info.value.message
    assert peak < 1 << 20, peak
    assert decode(npy_bytes(np.ones((1, 4), np.float32)), "application/x-npy", inputs).shape == (1, 4)


def test_slow_image_and_json_decodes_wait_in_their_own_lane(bundle_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = bodies_module.decode
    threads: dict[str, str] = {}

    def slow_decode(body: bytes, content_type: str | None, spec: InputSpec, *rest: object) -> np.ndarray:
        threads[str(content_type)] = threading.current_thread().name
        if content_type == "application/json":
            time.sleep(0.8)
        return real(body, content_type, spec, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(bodies_module, "decode", slow_decode)
    server = ApiServer(create_app(make_controller(bundle_dir), ApiOptions(workers=1, max_queue=8)),
                       ServerOptions(port=0))
    server.start_background()
    try:
        import json

        body = json.dumps({"inputs": [0.0, 0.0, 0.0, 0.0]}).encode()
        slow = [threading.Thread(target=lambda: _json(server.port, body)) for _ in range(3)]
        for t in slow:
            t.start()
        time.sleep(0.2)  # three slow JSON decodes queued in the decoding lane (2.4 s of it)
        status, npy_ms = _request(server.port, "POST", "/v1/predict", npy_bytes(np.zeros((1, 4), np.float32)))
        for t in slow:
            t.join()
        assert status == 200 and npy_ms < 600, npy_ms  # not behind the JSON decodes
        assert threads["application/json"].startswith("hmt-decode")
        assert threads["application/x-npy"].startswith("hmt-infer")
    finally:
        server.stop_background()


def _json(port: int, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/predict", body=body, headers={"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
