"""The peer's API in process: a segment answers like the local chain; bad tensors and tokens get 4xx."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import INPUT_SHAPE

from hmt.bundle import load_bundle
from hmt.deploy.offload import OffloadBundles
from hmt.offload.codec import encode
from hmt.offload.parts import SplitChain
from hmt.offload.peer import PeerOptions, PeerService, create_peer_app
from hmt.offload.plan import load_plan

TOKEN = "t" * 24


@pytest.fixture(scope="module")
def client(offload_bundles: OffloadBundles) -> Iterator[TestClient]:
    bundle = load_bundle(offload_bundles.peer)
    service = PeerService(bundle, load_plan(bundle), PeerOptions(token=TOKEN), warmup_runs=1)
    with TestClient(create_peer_app(service)) as client:  # one lifespan: its end stops the service
        yield client


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def _head(offload_bundles: OffloadBundles, cut: int) -> tuple[np.ndarray, int]:
    device = load_bundle(offload_bundles.device)
    chain = SplitChain(device, device.spec.variant("deep"), load_plan(device).for_variant("deep"))
    x = np.random.default_rng(9).standard_normal(INPUT_SHAPE).astype(np.float32)
    middle = chain.run_head(x, chain.cut(cut), None)
    assert isinstance(middle, np.ndarray)
    return middle, chain.run_local(x, None).class_index


def test_segment_answers_like_the_whole_chain(client: TestClient, offload_bundles: OffloadBundles) -> None:
    for cut in (0, 1, 2):
        middle, expected = _head(offload_bundles, cut)
        for codec in ("float32", "float16"):
            enc = encode(middle, codec)
            r = client.post(f"/v1/segment?variant=deep&cut={cut}", content=enc.body,
                            headers=enc.headers | _auth())
            assert r.status_code == 200, r.text
            assert r.json()["class"] == expected and r.json()["exit"] == 1
    status = client.get("/v1/status", headers=_auth()).json()
    assert status["role"] == "peer" and len(status["variants"]["deep"]["tail_ms"]) == 3
    assert status["queue"]["max_queue"] == 32 and 0 <= status["load"]["cpu_util"] <= 1


@pytest.mark.parametrize(("query", "headers", "body", "status", "code"), [
    ("variant=deep&cut=1", {"x-hmt-shape": "1,4,4,4"}, b"\0" * 10, 400, "bad_tensor"),
    ("variant=deep&cut=1", {"x-hmt-shape": "1,3,8,8"}, b"\0" * 768, 422, "bad_tensor"),
    ("variant=deep&cut=1", {"x-hmt-shape": "1,4,4,4"}, np.full(64, np.nan, np.float32).tobytes(), 422,
     "bad_tensor"),
    ("variant=deep&cut=1", {"x-hmt-shape": "1,4,4,4", "x-hmt-codec": "int8"}, b"\0" * 64, 400, "bad_tensor"),
    ("variant=nope&cut=0", {"x-hmt-shape": "1,3,8,8"}, b"\0" * 768, 404, "unknown_variant"),
    ("variant=deep&cut=7", {"x-hmt-shape": "1,3,8,8"}, b"\0" * 768, 404, "unknown_cut"),
    ("variant=deep&cut=x", {}, b"", 400, "bad_cut"),
    ("variant=deep&cut=0", {"x-hmt-shape": "1,3,8,8"}, b"\0" * (1 << 16), 413, "body_too_large"),
    ("variant=deep&cut=0", {"x-hmt-shape": "1,3,8,8", "x-deadline-ms": "-1"}, b"\0" * 768, 400, "bad_header"),
])
def test_malformed_segment_gets_4xx_and_the_peer_stays_up(client: TestClient, offload_bundles: OffloadBundles,
                                                          query: str, headers: dict[str, str], body: bytes,
                                                          status: int, code: str) -> None:
    r = client.post(f"/v1/segment?{query}", content=body, headers=headers | _auth())
    assert r.status_code == status and r.json()["error"]["code"] == code
    middle, expected = _head(offload_bundles, 1)
    enc = encode(middle, "float32")
    ok = client.post("/v1/segment?variant=deep&cut=1", content=enc.body, headers=enc.headers | _auth())
    assert ok.status_code == 200 and ok.json()["class"] == expected


def test_token_is_required_on_every_path(client: TestClient) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": TOKEN}):
        for method, path in (("GET", "/v1/status"), ("POST", "/v1/segment?variant=deep&cut=0"),
                             ("POST", "/v1/probe"), ("GET", "/v1/health/live")):
            r = client.request(method, path, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert client.post("/v1/probe", content=b"x" * 1000, headers=_auth()).json()["bytes"] == 1000
