"""Dynamic batching (opt-in): concurrent requests run as one batch on graphs that take a batch, with early
exit per row, and answer exactly as they do one by one; graphs with a fixed batch axis run item by item."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from serve_bundles import FAST_SWITCH, make_bundle, npy_bytes

from hmt.bundle import load_bundle
from hmt.errors import UsageError
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.server import ApiServer, ServerOptions
from hmt.serve.running.batching import BatchingOptions

# Rows that leave at exit 0 (confident) and rows that go on to exit 1 (uniform), mixed in each batch.
INPUTS = [np.array([[9.0 * (i % 4 == j) if i % 3 else 0.0 for j in range(4)]], np.float32) for i in range(12)]


def post(port: int, x: np.ndarray) -> dict:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/predict", body=npy_bytes(x), headers={"content-type": "application/x-npy"})
    response = conn.getresponse()
    doc = json.loads(response.read())
    conn.close()
    assert response.status == 200, doc
    return doc  # type: ignore[no-any-return]


def serve_all(bundle: Path, options: ApiOptions) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    controller = Controller(load_bundle(bundle), ServeSettings.from_mapping(
        {**FAST_SWITCH, "estimates": {"probe_share": 0.0}}), warmup_runs=1, fixed_variant="big")
    controller.start(background=False)
    server = ApiServer(create_app(controller, options), ServerOptions(port=0, raise_fd_limit=False))
    server.start_background()
    try:
        answers: list[dict] = [{}] * len(INPUTS)  # type: ignore[type-arg]

        def send(i: int) -> None:
            answers[i] = post(server.port, INPUTS[i])

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(INPUTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/v1/status")
        status = json.loads(conn.getresponse().read())
        conn.close()
    finally:
        server.stop_background()
        controller.stop()
    return answers, status


def same(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    assert (a["class"], a["exit"], a["variant"]) == (b["class"], b["exit"], b["variant"])
    assert a["confidence"] == pytest.approx(b["confidence"], rel=1e-5)


def test_batched_answers_equal_single_ones(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "batchable", serve=FAST_SWITCH, dynamic_batch=True)
    single, off = serve_all(bundle, ApiOptions(workers=1))
    batched, on = serve_all(bundle, ApiOptions(workers=1, dynamic_batch=8, dynamic_batch_delay_ms=50))
    for a, b in zip(batched, single, strict=True):
        same(a, b)
    assert {a["exit"] for a in batched} == {0, 1}  # early exit per row inside a batch
    assert off["batching"] == {"enabled": False}
    batching = on["batching"]
    assert batching["variants_take_a_batch"] == {"big@onnxruntime": True}
    assert batching["inputs"] == len(INPUTS) and batching["batches"] < len(INPUTS) and batching["mean_batch"] > 1
    assert on["requests"] == len(INPUTS)  # every batched answer is filed with the loop


def test_graphs_with_a_fixed_batch_axis_run_item_by_item(bundle_dir: Path) -> None:
    single, _ = serve_all(bundle_dir, ApiOptions(workers=1))
    batched, on = serve_all(bundle_dir, ApiOptions(workers=1, dynamic_batch=8, dynamic_batch_delay_ms=20))
    for a, b in zip(batched, single, strict=True):
        same(a, b)
    assert on["batching"]["variants_take_a_batch"] == {"big@onnxruntime": False}


def test_options_are_checked() -> None:
    assert not BatchingOptions().enabled and BatchingOptions(4).enabled
    with pytest.raises(UsageError, match="--dynamic-batch must be >= 1"):
        ApiOptions(dynamic_batch=0)
    with pytest.raises(UsageError, match="--dynamic-batch-delay-ms"):
        ApiOptions(dynamic_batch=4, dynamic_batch_delay_ms=-1)
