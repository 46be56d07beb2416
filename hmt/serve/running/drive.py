"""Driving a scenario: clients send requests at the scenario's rate while its rows are applied on time.

Clients are threads in this process, or spawned processes (``client_mode`` "processes") that post
to serve's API like a user's clients. A spawned client imports numpy and builds its sender first,
which takes a second here and several on a slow board (an emulated Raspberry Pi-class CPU budget
took more than the 1.5 s once allowed), so the scenario's clock starts only once every client
process has said it is up (bounded by :data:`CLIENTS_UP_TIMEOUT_S`).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from queue import Empty
from typing import Any, Callable

import numpy as np

from hmt.errors import DeviceError, UsageError
from hmt.serve.running.scenario import (
    DriveOptions,
    Inputs,
    RequestRecord,
    Scenario,
    ScenarioRow,
    Send,
    budget_at,
    http_sender,
    next_arrival_s,
)

CLIENTS_UP_TIMEOUT_S = 120.0  # spawned client processes import numpy: seconds on a slow board


def _client_loop(send: Send, inputs: Inputs, client: int, clients: int, period_s: float, start_s: float,
                 stop_s: float, budget: Callable[[float], float | None], stop: threading.Event | None = None,
                 clock: Callable[[], float] = time.monotonic, arrivals: str = "constant",
                 seed: int = 0) -> list[RequestRecord]:
    """One client: samples ``client, client + clients, ...`` (cycling), at ``arrivals`` with a mean gap of
    ``period_s``, until ``stop_s``."""
    records: list[RequestRecord] = []
    n = len(inputs.x)
    rng = np.random.default_rng([seed, client]) if arrivals == "poisson" else None
    phase_s = period_s * client / max(1, clients)
    # Stagger the clients over a gap (on/off sends at twice the rate: over half a gap).
    next_s = max(clock(), start_s) + (phase_s / 2 if arrivals == "onoff" else phase_s)
    k = 0
    while True:
        wait_s = min(next_s, stop_s) - clock()
        if wait_s > 0 and stop is not None and stop.wait(wait_s):
            break
        if wait_s > 0 and stop is None:
            time.sleep(wait_s)
        sent_s = clock()
        if sent_s >= stop_s or (stop is not None and stop.is_set()):
            break
        next_s = next_arrival_s(next_s, period_s, start_s, arrivals, rng, phase_s)
        if arrivals == "constant":
            next_s = max(next_s, sent_s)  # fell behind: do not burst
        i = (client + k * clients) % n
        k += 1
        label = None if inputs.y is None else int(inputs.y[i])
        in_force = budget(sent_s - start_s)
        try:
            status, doc = send(inputs.x[i])
            error = None if status == 200 else str(doc.get("error", doc))
        except Exception as exc:  # noqa: BLE001 - a transport failure is a failed request, recorded
            status, doc, error = 0, {}, f"{type(exc).__name__}: {exc}"
        client_ms = (clock() - sent_s) * 1e3
        ok = status == 200
        records.append(RequestRecord(
            time_s=sent_s - start_s, status=status, client_ms=client_ms,
            latency_ms=doc.get("latency_ms") if ok else None, compute_ms=doc.get("compute_ms") if ok else None,
            variant=doc.get("variant") if ok else None, exit=doc.get("exit") if ok else None,
            predicted=doc.get("class") if ok else None, label=label, latency_budget_ms=in_force, error=error))
    return records


def _client_process(url: str, token: str | None, inputs_path: str, client: int, clients: int, period_s: float,
                    window: Any, ready: Any, go: Any, rows: tuple[ScenarioRow, ...], base_latency_ms: float | None,
                    out: Any, arrivals: str = "constant", seed: int = 0) -> None:  # pragma: no cover - a child process
    """One client process: up (imports, inputs, sender), it says so on ``ready`` and waits for ``go``;
    ``window`` then holds the scenario's (start, stop) on the shared monotonic clock."""
    with np.load(inputs_path, allow_pickle=False) as archive:
        inputs = Inputs(archive["x"], archive["y"] if "y" in archive.files else None)
    send = http_sender(url, token)()
    ready.put(client)
    if not go.wait(CLIENTS_UP_TIMEOUT_S + 30.0):
        out.put([])
        return
    start_s, stop_s = window[0], window[1]
    scenario = Scenario(rows)
    records = _client_loop(send, inputs, client, clients, period_s, start_s, stop_s,
                           lambda t: budget_at(scenario, base_latency_ms, t), arrivals=arrivals, seed=seed)
    out.put(records)


def _wait_until_up(ready: Any, procs: Sequence[Any], timeout_s: float) -> None:
    """Every client process has said it is up, or a :class:`DeviceError`: one died, or ``timeout_s`` passed."""
    deadline_s = time.monotonic() + timeout_s
    up = 0
    while up < len(procs):
        try:
            ready.get(timeout=0.2)
            up += 1
            continue
        except Empty:  # check on the processes, then wait on
            pass
        dead = [p.exitcode for p in procs if p.exitcode is not None]
        if dead:
            raise DeviceError(f"a scenario client process exited before it was up (exit codes {dead})")
        if time.monotonic() > deadline_s:
            raise DeviceError(f"{len(procs) - up} of {len(procs)} scenario client processes were not up within "
                              f"{timeout_s:g} s (a slow device: fewer clients, or clients as threads)")


def _start_client_processes(ctx: Any, url: tuple[str, str | None], inputs: Inputs, options: DriveOptions,
                            period_s: float, rows: Sequence[ScenarioRow], base_latency_ms: float | None,
                            out: Any) -> tuple[list[Any], str, float]:
    """Spawn the client processes and start the scenario's clock once every one is up: (processes,
    their scratch folder, start on the shared monotonic clock). On failure nothing is left behind."""
    # Through a file, not the spawn pipe: a child that dies before reading a large
    # pickled argument would leave the parent blocked on the pipe.
    scratch = tempfile.mkdtemp(prefix="hmt-scenario-")
    inputs_path = os.path.join(scratch, "inputs.npz")
    if inputs.y is None:
        np.savez(inputs_path, x=inputs.x)
    else:
        np.savez(inputs_path, x=inputs.x, y=inputs.y)
    # Spawned children take a second to import here, many on a slow board: the scenario's clock
    # starts once every one of them says it is up.
    window, ready, go = ctx.Array("d", 2), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_client_process, name=f"hmt-scenario-client-{i}", daemon=True,
                         args=(url[0], url[1], inputs_path, i, options.clients, period_s, window, ready, go,
                               tuple(rows), base_latency_ms, out, options.arrivals, options.seed))
             for i in range(options.clients)]
    try:
        for proc in procs:
            proc.start()
        _wait_until_up(ready, procs, CLIENTS_UP_TIMEOUT_S)
    except BaseException:
        for proc in procs:
            if proc.pid is not None:
                proc.terminate()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    start_s = time.monotonic() + 0.05
    window[0], window[1] = start_s, start_s + options.duration_s
    go.set()
    return procs, scratch, start_s


def _apply_rows(rows: list[ScenarioRow], apply_row: Callable[[ScenarioRow], object], start_s: float,
                stop_s: float, duration_s: float) -> None:
    """Apply each row at its time (monotonic clock, from ``start_s``), then wait for ``stop_s``."""
    for row in rows:
        if row.time_s >= duration_s:
            break
        time.sleep(max(0.0, start_s + row.time_s - time.monotonic()))
        apply_row(row)
    time.sleep(max(0.0, stop_s - time.monotonic()))


def _collect_processes(procs: list[Any], queue: Any, stop_s: float) -> list[RequestRecord]:
    """The records every client process sent back (a process that died sends none), then the processes ended."""
    records: list[RequestRecord] = []
    for _ in procs:
        try:
            records.extend(queue.get(timeout=max(10.0, stop_s - time.monotonic() + 30.0)))
        except Exception:  # noqa: BLE001 - a client process that died is reported by the caller
            break
    for proc in procs:
        proc.join(5.0)
        if proc.is_alive():
            proc.terminate()
    return records


def drive(
    scenario: Scenario,
    options: DriveOptions,
    apply_row: Callable[[ScenarioRow], object],
    sender_factory: Callable[[], Send] | None,
    inputs: Inputs,
    base_latency_ms: float | None = None,
    url: tuple[str, str | None] | None = None,
    on_start: Callable[[float], object] | None = None,
) -> tuple[float, list[RequestRecord]]:
    """Apply each row at its time while ``clients`` clients send for ``duration_s``.

    Clients are threads calling ``sender_factory()``'s sender, or (``client_mode``
    "processes") processes posting to ``url`` = (base URL, token). Each request is judged
    against the latency budget in force when it was sent (the row's, else
    ``base_latency_ms``). Returns the scenario's start (monotonic clock, shared by all
    processes on Linux) and every request's record, by send time. ``on_start`` is told that start
    before the first row is applied (so that what follows the rows on its own can start on time).
    """
    clock = time.monotonic
    rows = list(scenario.rows)
    period_s = options.clients / options.rate_hz if options.clients else 1.0
    use_processes = options.client_mode == "processes" and options.clients > 0
    if use_processes and url is None:
        raise UsageError("client processes send through the API: a server URL is needed")
    ctx = multiprocessing.get_context("spawn")
    queue: Any = ctx.Queue() if use_processes else None
    procs: list[Any] = []
    start_s = clock()
    stop_s = start_s + options.duration_s
    stop = threading.Event()
    records: list[RequestRecord] = []
    lock = threading.Lock()

    def budget(t: float) -> float | None:
        return budget_at(scenario, base_latency_ms, t)

    def client(index: int) -> None:
        if sender_factory is None:
            return
        got = _client_loop(sender_factory(), inputs, index, options.clients, period_s, start_s, stop_s, budget,
                           stop, arrivals=options.arrivals, seed=options.seed)
        with lock:
            records.extend(got)

    threads: list[threading.Thread] = []
    scratch: str | None = None
    if use_processes:
        assert url is not None
        procs, scratch, start_s = _start_client_processes(ctx, url, inputs, options, period_s, rows,
                                                          base_latency_ms, queue)
        stop_s = start_s + options.duration_s
    elif sender_factory is not None:
        threads = [threading.Thread(target=client, args=(i,), name=f"hmt-scenario-client-{i}", daemon=True)
                   for i in range(options.clients)]
    if on_start is not None:
        on_start(start_s)
    time.sleep(max(0.0, start_s - clock()))
    apply_row(rows[0])
    for thread in threads:
        thread.start()
    try:
        _apply_rows(rows[1:], apply_row, start_s, stop_s, options.duration_s)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30.0)
        records.extend(_collect_processes(procs, queue, stop_s))
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if any(t.is_alive() for t in threads):
        raise DeviceError("a scenario client did not finish within 30 s of the end")
    if procs and any(proc.exitcode != 0 for proc in procs):
        raise DeviceError(f"a scenario client process failed (exit codes {[p.exitcode for p in procs]})")
    records.sort(key=lambda r: r.time_s)
    return start_s, records
