"""The throttling proxy on real loopback sockets: bandwidth, delay, loss, a dead upstream, a scenario."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from hmt.errors import InputError
from hmt.offload.proxy import LinkScenario, LinkState, ThrottlingProxy


async def _echo_server() -> tuple[asyncio.base_events.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def _round_trip(port: int, payload: bytes) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(payload)
    await writer.drain()
    got = b""
    while len(got) < len(payload):
        got += await reader.read(65536)
    elapsed = time.perf_counter() - start
    assert got == payload
    writer.close()
    return elapsed


def _run(state: LinkState, payload: bytes, seed: int = 0, rounds: int = 1) -> list[float]:
    async def main() -> list[float]:
        server, port = await _echo_server()
        proxy = ThrottlingProxy("127.0.0.1", port, rng=np.random.default_rng(seed), state=state, rto_ms=100)
        listen = await proxy.start()
        times = [await _round_trip(listen, payload) for _ in range(rounds)]
        await proxy.close()
        server.close()
        return times

    return asyncio.run(main())


def test_unthrottled_is_fast_and_bandwidth_throttles() -> None:
    payload = bytes(range(256)) * 100  # 25.6 kB each way
    (fast,) = _run(LinkState(), payload)
    # 1 Mbit/s: 205 ms to serialise each way (the echo overlaps the two directions only partly).
    (slow,) = _run(LinkState(bandwidth_mbit_s=1.0), payload)
    assert fast < 0.1
    assert 0.2 <= slow < 0.8


def test_delay_is_added_each_way() -> None:
    times = _run(LinkState(rtt_ms=80.0), b"ping", rounds=3)
    assert all(0.08 <= t < 0.3 for t in times)


def test_loss_delays_by_the_retransmission_timeout() -> None:
    times = _run(LinkState(loss=0.5), b"x", seed=1, rounds=8)
    late = sum(t >= 0.1 for t in times)
    assert 1 <= late <= 7  # some chunks "lost" (100 ms late), some not; seeded


def test_dead_upstream_closes_the_connection_at_once() -> None:
    async def main() -> bytes:
        proxy = ThrottlingProxy("127.0.0.1", 1, rng=np.random.default_rng(0))  # nothing listens on port 1
        listen = await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", listen)
        writer.write(b"hello")
        data = await asyncio.wait_for(reader.read(10), 2.0)
        await proxy.close()
        return data

    assert asyncio.run(main()) == b""


def test_scenario_columns(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("time_s,cpu_load,link_bandwidth_mbit_s,link_rtt_ms,link_loss\n"
                    "0,,100,1,\n10,0.5,2,40,0.01\n20,,,,\n")
    scenario = LinkScenario.from_csv(path)
    assert scenario.at(5) == LinkState(100, 1, 0)
    assert scenario.at(10) == LinkState(2, 40, 0.01)
    assert scenario.at(25) == LinkState(2, 40, 0.01)  # empty cells keep the previous row's value
    path.write_text("time_s,link_rtt_ms\n0,-3\n")
    with pytest.raises(InputError, match=r"s.csv:2"):
        LinkScenario.from_csv(path)


@pytest.mark.parametrize(("text", "message"), [
    # a blank line and a quoted cell over two lines: the error names the file's line, not the row count
    ("time_s,link_rtt_ms\n0,1\n\n5,\"2\n\"\n9,x\n", r"s.csv:6: link_rtt_ms 'x' is not a number"),
    ("\ufefftime_s,link_loss\r0,0.1\r3,1.5\r", r"s.csv:3: link_loss '1.5' outside \[0, 0.99\]"),
    ("time_s,link_bandwidth_mbit_s\n0,0\n", r"s.csv:2: link_bandwidth_mbit_s '0' outside \(0, 1e\+06\]"),
    ("time_s,link_rtt_ms\n0,nan\n", r"s.csv:2: link_rtt_ms 'nan' outside"),
    ("time_s,link_rtt_ms\n5,1\n2,1\n", r"s.csv:3: time_s 2 is before the previous row's 5"),
    ("time_s,link_rtt_ms\n", r"s.csv: no rows"),
    ("time_s,cpu_load\n0,1\n", r"needs time_s and some of"),
])
def test_a_link_scenario_is_read_as_serve_reads_a_scenario(tmp_path: Path, text: str, message: str) -> None:
    """Line numbers count the file's lines (a blank line, a quoted cell over two lines), a BOM and CR
    line endings read, NaN and out-of-range values refused with the column and its range."""
    path = tmp_path / "s.csv"
    path.write_bytes(text.encode("utf-8"))
    with pytest.raises(InputError, match=message):
        LinkScenario.from_csv(path)
