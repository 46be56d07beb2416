"""A throttling TCP proxy (asyncio) between a device and its peer, for testing on one machine.

Each direction is one emulated link shared by every connection, like a real uplink:

- bandwidth: a chunk occupies the link for ``size * 8 / bandwidth`` after the previous
  chunk of that direction left it (serialisation, so queues build up under load);
- delay: it arrives ``rtt_ms / 2`` after it left the link (propagation, each direction);
- loss: TCP never loses bytes, it resends them; a lost chunk is therefore delivered
  ``rto_ms`` late (TCP's minimum retransmission timeout on Linux is 200 ms), drawn per
  chunk with probability ``loss`` from the generator passed in.

Order within a connection is kept: a chunk is never delivered before the one before it.
Conditions change with :meth:`ThrottlingProxy.set_link` or follow a :class:`LinkScenario`
(``time_s`` plus the new scenario columns ``link_bandwidth_mbit_s``, ``link_rtt_ms``,
``link_loss``; an empty cell keeps the row before's value; the file may hold serve's columns too,
which the proxy ignores).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hmt.compat import strict_zip
from hmt.errors import InputError, UsageError
from hmt.serve.running.scenario import Scenario

LINK_COLUMNS = ("link_bandwidth_mbit_s", "link_rtt_ms", "link_loss")
_CHUNK_BYTES = 16384


@dataclass(frozen=True)
class LinkState:
    bandwidth_mbit_s: float = math.inf
    rtt_ms: float = 0.0
    loss: float = 0.0

    def __post_init__(self) -> None:
        if not (self.bandwidth_mbit_s > 0) or not (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0):
            raise UsageError(f"link needs bandwidth > 0 and rtt >= 0, got {self.bandwidth_mbit_s}, {self.rtt_ms}")
        if not 0 <= self.loss < 1:
            raise UsageError(f"link loss must be in [0, 1), got {self.loss}")


@dataclass(frozen=True)
class LinkScenario:
    """Link conditions over time: each row holds from its ``time_s`` until the next."""

    times_s: tuple[float, ...]
    states: tuple[LinkState, ...]

    def at(self, t_s: float) -> LinkState:
        state = self.states[0]
        for start, row in strict_zip(self.times_s, self.states):
            if start <= t_s:
                state = row
        return state

    @classmethod
    def from_csv(cls, path: Path | str) -> LinkScenario:
        """Read by serve's scenario reader (:class:`hmt.serve.running.scenario.Scenario`: bounded, each
        error naming the file's line and the column's range); an empty cell keeps the row before's value."""
        rows = Scenario.from_csv(path).rows
        if all(r.link_bandwidth_mbit_s is None and r.link_rtt_ms is None and r.link_loss is None for r in rows):
            raise InputError(f"{path}: needs time_s and some of {list(LINK_COLUMNS)} in its header")
        states: list[LinkState] = []
        previous = LinkState()
        for r in rows:
            bandwidth, rtt, loss = r.link_bandwidth_mbit_s, r.link_rtt_ms, r.link_loss
            previous = LinkState(previous.bandwidth_mbit_s if bandwidth is None else bandwidth,
                                 previous.rtt_ms if rtt is None else rtt, previous.loss if loss is None else loss)
            states.append(previous)
        return cls(tuple(r.time_s for r in rows), tuple(states))


class _Direction:
    """One direction of the emulated link: when it is next free."""

    def __init__(self) -> None:
        self.free_at = 0.0


class ThrottlingProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, rng: np.random.Generator,
                 state: LinkState | None = None, rto_ms: float = 200.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.state = state if state is not None else LinkState()
        self.rng = rng
        self.rto_ms = rto_ms
        self._up = _Direction()
        self._down = _Direction()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0
        self.bytes = {"up": 0, "down": 0}
        self.connections = 0

    def set_link(self, state: LinkState) -> None:
        self.state = state

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _schedule(self, direction: _Direction, size: int) -> float:
        """When a chunk of ``size`` bytes sent now is delivered (loop time)."""
        now = asyncio.get_running_loop().time()
        state = self.state
        start = max(now, direction.free_at)
        serialise = 0.0 if math.isinf(state.bandwidth_mbit_s) else size * 8 / (state.bandwidth_mbit_s * 1e6)
        direction.free_at = start + serialise
        arrive = direction.free_at + state.rtt_ms / 2e3
        if state.loss > 0 and float(self.rng.random()) < state.loss:
            arrive += self.rto_ms / 1e3
        return arrive

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: _Direction,
                    label: str) -> None:
        pending: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            loop = asyncio.get_running_loop()
            while (item := await pending.get()) is not None:
                at, data = item
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(_CHUNK_BYTES):
                self.bytes[label] += len(data)
                pending.put_nowait((self._schedule(direction, len(data)), data))
        except (ConnectionError, OSError):
            pass
        finally:
            pending.put_nowait(None)
            with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
                await sender

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.close()  # the peer is down: the device sees the connection close at once
            return
        await asyncio.gather(self._pump(client_reader, up_writer, self._up, "up"),
                             self._pump(up_reader, client_writer, self._down, "down"), return_exceptions=True)


async def run_proxy(listen_port: int, upstream_port: int, scenario: LinkScenario, start_wall_s: float,
                    duration_s: float, seed: int, ready: asyncio.Event | None = None) -> dict[str, int]:
    """Serve on loopback following ``scenario`` (its time 0 is ``start_wall_s``, a ``time.time()``)."""
    proxy = ThrottlingProxy("127.0.0.1", upstream_port, rng=np.random.default_rng(seed), state=scenario.at(0.0))
    await proxy.start("127.0.0.1", listen_port)
    if ready is not None:
        ready.set()
    try:
        while (elapsed := time.time() - start_wall_s) < duration_s:
            proxy.set_link(scenario.at(elapsed))
            await asyncio.sleep(0.02)
    finally:
        await proxy.close()
    return dict(proxy.bytes)
