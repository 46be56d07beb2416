"""The peer process under slow sockets: the main server's connection guard keeps it answering."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_fallback import TOKEN, _start_peer

from hmt.deploy.offload import OffloadBundles
from hmt.offload.client import PeerClient


@pytest.mark.slow
def test_slow_sockets_do_not_hold_the_peer(offload_bundles: OffloadBundles) -> None:
    proc, url = _start_peer(offload_bundles.peer, extra=("--max-connections", "16", "--receipt-timeout-s", "1"))
    host, port = url.removeprefix("http://").split(":")
    slow: list[socket.socket] = []
    try:
        for _ in range(64):  # four times the cap, each trickling an unfinished header
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        client = PeerClient(url, token=TOKEN)
        answered = 0
        for _ in range(9):
            try:
                client.call("GET", "/v1/health/live", limit_ms=3000)
                answered += 1
            except Exception:  # noqa: BLE001 - counted: the figure is how many probes got through
                pass
        assert answered == 9
        time.sleep(1.5)  # past the receipt deadline: the slow ones still open got a 408 or were evicted
        status = client.call("GET", "/v1/status", limit_ms=3000)
        connections = status.body["connections"]
        assert connections["evicted"] + connections["receipt_timeouts"] >= 48
    finally:
        for s in slow:
            s.close()
        proc.terminate()
        proc.wait(20)
    assert proc.stderr is not None
    assert len(proc.stderr.read()) < 20_000  # the log stays small
