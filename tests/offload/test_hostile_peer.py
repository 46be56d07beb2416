"""A peer that answers slowly, wrongly or from another bundle: the device answers itself, in time."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import INPUT_SHAPE, make_conv_bundle

from hmt.bundle import load_bundle
from hmt.deploy.offload import OffloadBundles, write_offload_bundles
from hmt.offload.client import PeerClient, PeerFailure, Reply
from hmt.offload.codec import encode
from hmt.offload.device import WHERE_FALLBACK, WHERE_PEER, DeviceOptions, OffloadDevice
from hmt.offload.parts import SplitChain
from hmt.offload.peer import GRAPHS_HEADER, PeerOptions, PeerService, create_peer_app
from hmt.offload.plan import load_plan
from hmt.offload.planner import Option
from hmt.offload.timing import NO_SHARE


@pytest.fixture()
def trickling_peer() -> Iterator[int]:
    """Reads a request, then sends a valid answer one byte every 20 ms (about 2.5 s in all)."""
    server = socket.create_server(("127.0.0.1", 0))
    body = b'{"class": 1, "confidence": 0.9, "exit": 1, "pad": "' + b"x" * 40 + b'"}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            for i in range(len(answer)):
                try:
                    conn.sendall(answer[i:i + 1])
                except OSError:
                    return
                time.sleep(0.02)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_a_trickled_answer_cannot_hold_the_request_past_its_limit(trickling_peer: int) -> None:
    client = PeerClient(f"http://127.0.0.1:{trickling_peer}")
    start = time.perf_counter()
    with pytest.raises(PeerFailure) as info:
        client.status(limit_ms=200.0)
    # Each byte came within the socket timeout, so only a limit over the whole read stops it.
    assert info.value.reason == "timeout"
    assert time.perf_counter() - start < 1.0


class _Scripted:
    """A peer client that answers every segment with ``body``."""

    url = "http://scripted"

    def __init__(self, body: Any) -> None:
        self.body = body

    def segment(self, *args: Any, limit_ms: float, **kwargs: Any) -> Reply:
        return Reply(self.body, 5.0, NO_SHARE)

    def status(self, limit_ms: float) -> Reply:
        return Reply({"variants": {}, "load": {"compute_ratio": 1.0}}, 1.0, NO_SHARE)

    def close(self) -> None:
        pass


def _device(offload_bundles: OffloadBundles, client: Any, **options: Any) -> OffloadDevice:
    bundle = load_bundle(offload_bundles.device)
    return OffloadDevice(bundle, load_plan(bundle), client,
                         DeviceOptions(**{"budget_ms": 200.0, "fixed_variant": "deep", **options}),
                         rng=np.random.default_rng(0), warmup_runs=1)


@pytest.mark.parametrize("body", [
    {"class": 999, "confidence": 0.9, "exit": 1},
    {"class": -1, "confidence": 0.9, "exit": 1},
    {"class": 1, "confidence": float("nan"), "exit": 1},
    {"class": 1, "confidence": 0.9, "exit": 7},
    {"class": True, "confidence": 0.9, "exit": 1},
    {"class": 1, "confidence": 0.9, "exit": 1, "server_ms": -1e9},
    {"class": 1, "confidence": 0.9, "exit": 1, "queue_ms": float("inf")},
])
def test_a_garbage_answer_is_not_served_and_does_not_touch_the_estimates(
        offload_bundles: OffloadBundles, body: dict[str, Any]) -> None:
    device = _device(offload_bundles, _Scripted(body))
    before = device.link.estimate()
    x = np.random.default_rng(1).standard_normal(INPUT_SHAPE).astype(np.float32)
    result = device.run(x, Option("deep", 0, "float32", 1.0, 1.0, 0.0, True, 0.5))
    assert result.where == WHERE_FALLBACK and device.errors["bad_reply"] == 1
    assert result.class_index == device.chains["deep"].run_local(x, None).class_index
    after = device.link.estimate()
    assert (after.ms_per_byte, after.samples) == (before.ms_per_byte, before.samples)
    assert device.peer_queue_ms == 0.0


def test_a_sound_answer_still_serves(offload_bundles: OffloadBundles) -> None:
    device = _device(offload_bundles, _Scripted({"class": 3, "confidence": 0.5, "exit": 1, "server_ms": 1.0,
                                                 "compute_ms": 0.8, "queue_ms": 0.1}))
    x = np.random.default_rng(1).standard_normal(INPUT_SHAPE).astype(np.float32)
    result = device.run(x, Option("deep", 0, "float32", 1.0, 1.0, 0.0, True, 0.5))
    assert result.where == WHERE_PEER and result.class_index == 3


@pytest.fixture(scope="module")
def other_split(tmp_path_factory: pytest.TempPathFactory) -> OffloadBundles:
    """The same variants, shapes and cuts as the offload bundles, other weights."""
    root = tmp_path_factory.mktemp("other")
    return write_offload_bundles(make_conv_bundle(root / "bundle", seed=7), root / "device", root / "peer", seed=3)


def test_another_bundles_peer_is_refused(offload_bundles: OffloadBundles, other_split: OffloadBundles) -> None:
    peer_bundle = load_bundle(other_split.peer)
    service = PeerService(peer_bundle, load_plan(peer_bundle), PeerOptions(), warmup_runs=1)
    device_bundle = load_bundle(offload_bundles.device)
    chain = SplitChain(device_bundle, device_bundle.spec.variant("deep"), load_plan(device_bundle).for_variant("deep"))
    assert chain.graphs_sha256 != service.chains["deep"].graphs_sha256
    x = np.random.default_rng(2).standard_normal(INPUT_SHAPE).astype(np.float32)
    middle = chain.run_head(x, chain.cut(1), None)
    assert isinstance(middle, np.ndarray)
    enc = encode(middle, "float32")
    with TestClient(create_peer_app(service)) as client:
        refused = client.post("/v1/segment?variant=deep&cut=1", content=enc.body,
                              headers=enc.headers | {GRAPHS_HEADER: chain.graphs_sha256})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "different_graphs"
        same = client.post("/v1/segment?variant=deep&cut=1", content=enc.body,
                           headers=enc.headers | {GRAPHS_HEADER: service.chains["deep"].graphs_sha256})
        assert same.status_code == 200
        status = client.get("/v1/status").json()

    class _Status(_Scripted):
        def status(self, limit_ms: float) -> Reply:
            return Reply(status, 1.0, NO_SHARE)

    device = _device(offload_bundles, _Status({}))
    assert not device.refresh_peer_status()
    assert device.errors["probe_wrong_bundle"] == 1 and device.breaker.state != "closed"


def test_offloaded_and_fallback_answers_carry_the_probabilities(offload_bundles: OffloadBundles) -> None:
    """A client asking for top_k or probabilities is answered whichever route served it."""
    peer_bundle = load_bundle(offload_bundles.peer)
    service = PeerService(peer_bundle, load_plan(peer_bundle), PeerOptions(), warmup_runs=1)
    device = _device(offload_bundles, None)
    chain = device.chains["deep"]
    x = np.random.default_rng(3).standard_normal(INPUT_SHAPE).astype(np.float32)
    expected = chain.run_local(x, None).probabilities
    assert expected is not None and expected.shape == (device.bundle.spec.classes,)
    middle = chain.run_head(x, chain.cut(1), None)
    assert isinstance(middle, np.ndarray)
    body = service._work(service.chains["deep"], 1, middle, None, time.monotonic(), time.monotonic() + 5)
    body |= {"server_ms": 1.0, "compute_ms": 1.0, "queue_ms": 0.0}
    device.client = _Scripted(body)  # type: ignore[assignment]
    result = device.run(x, Option("deep", 1, "float32", 1.0, 1.0, 0.0, True, 0.5))
    assert result.where == WHERE_PEER and result.probabilities is not None
    np.testing.assert_allclose(result.probabilities, expected, atol=1e-6)
    device.client = _Scripted(body | {"probabilities": "AAAA"})  # type: ignore[assignment]  # one float, not 4
    result = device.run(x, Option("deep", 1, "float32", 1.0, 1.0, 0.0, True, 0.5))
    assert result.where == WHERE_FALLBACK and device.errors["bad_reply"] == 1
    assert result.probabilities is not None
    np.testing.assert_allclose(result.probabilities, expected, atol=1e-6)


def test_the_status_says_why_the_peer_fails(offload_bundles: OffloadBundles) -> None:
    """A peer whose certificate is not trusted: the breaker's last error names it, not just 'broken'."""

    class _Untrusted(_Scripted):
        def status(self, limit_ms: float) -> Reply:
            raise PeerFailure("broken", "SSLCertVerificationError: certificate verify failed: self-signed")

    device = _device(offload_bundles, _Untrusted({}))
    assert not device.refresh_peer_status()
    assert device.errors["probe_broken"] == 1
    assert "certificate verify failed" in device.status()["breaker"]["last_error"]


def test_a_plain_bundles_device_and_an_offload_splits_peer_disagree(conv_bundle: Path,
                                                                    offload_bundles: OffloadBundles) -> None:
    """A plain bundle offloads at its stage boundaries (cut 1: after segment 0); the split's peer numbers
    an inner cut 1 (of the same tensor shape here): cut 1 names another point of the chain on each side,
    so the digests differ and the peer refuses the device's cut 1 rather than run its own cut 1's tail."""
    plain = load_bundle(conv_bundle)
    boundary = SplitChain(plain, plain.spec.variant("deep"), load_plan(plain).for_variant("deep"))
    peer_bundle = load_bundle(offload_bundles.peer)
    split = SplitChain(peer_bundle, peer_bundle.spec.variant("deep"), load_plan(peer_bundle).for_variant("deep"))
    assert boundary.cut(1).kind == "boundary" and split.cut(1).kind == "inner"
    assert boundary.cut(1).tensor.shape == split.cut(1).tensor.shape
    assert boundary.graphs_sha256 != split.graphs_sha256
    again = SplitChain(plain, plain.spec.variant("deep"), load_plan(plain).for_variant("deep"))
    assert again.graphs_sha256 == boundary.graphs_sha256  # a plain bundle as its own peer still offloads


def test_a_silent_peer_leaves_the_fallback_time_before_the_deadline(offload_bundles: OffloadBundles) -> None:
    """The peer's wait is what is left of the budget after the request's queue (spent_ms), and
    without a latency budget serve plans with a share of the deadline, not all of it: before, a
    peer that never answered made the fallback finish past the 2,000 ms deadline (504)."""
    limits: list[float] = []

    class _Silent(_Scripted):
        def segment(self, *args: Any, limit_ms: float, **kwargs: Any) -> Reply:
            limits.append(limit_ms)
            raise PeerFailure("timeout", f"no answer within {limit_ms:.1f} ms")

    device = _device(offload_bundles, _Silent({}))
    x = np.random.default_rng(1).standard_normal(INPUT_SHAPE).astype(np.float32)
    result = device.run(x, Option("deep", 1, "float32", 1.0, 1.0, 0.0, True, 0.5), spent_ms=150.0)
    assert result.where == WHERE_FALLBACK and limits[0] <= 200.0 - 150.0

    from hmt.offload.session import DEADLINE_SHARE, PeerLink, open_device
    from hmt.serve.running.session import SessionOptions

    wrapped = open_device(offload_bundles.device, SessionOptions(), PeerLink("http://127.0.0.1:9"), deadline_ms=2000.0)
    try:
        assert wrapped.device.options.budget_ms == 2000.0 * DEADLINE_SHARE < 2000.0
        assert not wrapped.device.options.budget_given  # so the peer wait is capped (next test)
    finally:
        wrapped.stop()


def test_without_a_latency_budget_a_silent_peer_is_waited_for_about_as_long_as_the_local_tail(
        offload_bundles: OffloadBundles) -> None:
    """No latency budget: the device plans with a share of the request's deadline (1.8 s of 2 s), and
    a peer that accepted the connection and never answered held a request for all of it, on every
    retry of the breaker. A real silent socket here: the request is answered locally after at most
    max(PEER_WAIT_FLOOR_MS, twice the predicted remote time, the local tail's time), not 1.8 s."""
    from hmt.offload.device import PEER_WAIT_FLOOR_MS

    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)  # read nothing, answer nothing

    threading.Thread(target=accept, daemon=True).start()
    x = np.random.default_rng(2).standard_normal(INPUT_SHAPE).astype(np.float32)
    option = Option("deep", 1, "float32", 1.0, 1.0, 0.0, True, 0.5)
    try:
        for given, most_ms in ((False, 4 * PEER_WAIT_FLOOR_MS), (True, None)):
            device = _device(offload_bundles, PeerClient(f"http://127.0.0.1:{server.getsockname()[1]}"),
                             budget_ms=1800.0, budget_given=given)
            start = time.perf_counter()
            result = device.run(x, option)
            took_ms = (time.perf_counter() - start) * 1e3
            assert result.where == WHERE_FALLBACK and result.peer_error == "timeout"
            if most_ms is not None:
                assert took_ms < most_ms, took_ms
            else:  # a budget the user set is the user's: the peer gets what is left of it
                assert took_ms > 1000.0, took_ms
    finally:
        server.close()
        for conn in held:
            conn.close()
