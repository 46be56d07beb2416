"""Client processes of a scenario start its clock only once they are up (hmt.serve.running.drive).

A spawned client imports numpy and builds its sender first: a second here, several on a slow board.
The scenario used to start 1.5 s after spawning them, whatever they took; inside an emulated
Raspberry Pi-class CPU budget the clients came up after the scenario's 5 s calibration window had
closed, and it answered no request. A stub HTTP server stands in for serve's predict endpoint.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from hmt.errors import DeviceError
from hmt.serve.running.drive import _wait_until_up, drive
from hmt.serve.running.scenario import DriveOptions, Inputs, Scenario


class _Predict(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"variant": "v", "latency_ms": 0.1, "compute_ms": 0.1, "exit": 0, "class": 0}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Predict)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_more_client_processes_than_cores_all_send_from_the_start(url: str) -> None:
    """Sixteen spawned clients on one core take about 4 s to come up together; the code before started
    the scenario 1.5 s after spawning them and its 1 s went unsent (no request at all). Now each
    client sends from the scenario's first tenth of a second to its end, at the scenario's rate."""
    clients, rate_hz, duration_s = 16, 160.0, 1.0
    options = DriveOptions(duration_s=duration_s, clients=clients, rate_hz=rate_hz, client_mode="processes")
    inputs = Inputs(np.zeros((4, 1, 3), dtype=np.float32))
    applied: list[float] = []
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # the clients inherit one core: a slower board
    try:
        start_s, records = drive(Scenario.from_text("time_s\n0\n"), options,
                                 lambda row: applied.append(time.monotonic()), None, inputs, url=(url, None))
    finally:
        os.sched_setaffinity(0, cores)
    assert len(applied) == 1 and applied[0] >= start_s - 0.01
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert len(records) >= 0.8 * rate_hz * duration_s, len(records)
    # Every client's first request within its stagger (at most one gap, 0.1 s) of the start.
    assert sum(r.time_s < 0.15 for r in records) >= clients, sorted(r.time_s for r in records)[:clients]
    assert max(r.time_s for r in records) > 0.8 * duration_s


class _Proc:
    def __init__(self, exitcode: int | None = None) -> None:
        self.exitcode = exitcode


def test_waiting_for_clients_is_bounded_and_names_a_dead_one() -> None:
    ready = multiprocessing.get_context("spawn").Queue()
    for i in range(2):
        ready.put(i)
    _wait_until_up(ready, [_Proc(), _Proc()], timeout_s=5.0)  # both up
    with pytest.raises(DeviceError, match=r"exited before it was up \(exit codes \[1\]\)"):
        _wait_until_up(ready, [_Proc(), _Proc(1)], timeout_s=5.0)
    t0 = time.monotonic()
    with pytest.raises(DeviceError, match="1 of 1 scenario client processes were not up within 0.5 s"):
        _wait_until_up(ready, [_Proc()], timeout_s=0.5)
    assert time.monotonic() - t0 < 2.0
