"""Scenario replay: a CSV time series of load, battery and budgets drives the serve loop.

Columns (a header row; ``time_s`` required, the others optional, any order)::

    time_s             when the row starts, seconds from the scenario start (non-decreasing)
    cpu_load           background CPU load, share of all cores 0..1
    memory_budget_mb   memory budget (MB = 1e6 bytes)
    battery_pct        battery level 0..100
    latency_budget_ms  latency budget per request (queue wait + compute)
    memory_squeeze_mb  memory another process holds (MB): real memory pressure (see below)

Each row holds until the next one (a step function). An empty cell means "not set":
no background load, the base budget (serve.json or the command line), no battery
reading. The scenario lasts until its last row's ``time_s`` unless a duration is given.

``cpu_load`` is either reported to the loop as the CPU reading (``synthetic``: instead
of the live monitor) or made real (``burn``): processes that keep the given share of the
CPU capacity serve has (its cores and cgroup quota) busy in every 20 ms
(:mod:`hmt.serve.running.burn`), while the live monitor measures the machine. Likewise
``memory_squeeze_mb``: subtracted from the available memory the loop reads (``synthetic``), or
held by a process that allocates and touches it (``burn``: :mod:`hmt.serve.running.squeeze`);
the loop feels it through serve.json ``memory_reserve_mb``.
"""

from __future__ import annotations

import csv
import http.client
import io
import json
import math
import socket
import threading
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import numpy as np

from hmt.compat import pairwise
from hmt.errors import InputError, UsageError
from hmt.runtime.settings import MIN_LATENCY_BUDGET_MS
from hmt.serve.deciding.monitor import PsutilSampler, ResourceSample, Sampler

COLUMNS = ("time_s", "cpu_load", "memory_budget_mb", "battery_pct", "latency_budget_ms", "memory_squeeze_mb",
           # the link between device and peer, read by the offload proxy (hmt.offload.proxy); serve ignores them
           "link_bandwidth_mbit_s", "link_rtt_ms", "link_loss")
LOAD_MODES = ("synthetic", "burn")
# A scenario is read whole and its rows go into the burners' shared plan: bounded, so that a runaway
# export (a trace at 1 kHz) is refused at once with one line instead of slowing the replay's driver,
# its burners and its summary. The loop decides four times a second: 10,000 rows are 40 minutes of a
# row per tick, and a row per second for almost three hours.
MAX_ROWS = 10_000
MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class ScenarioRow:
    time_s: float
    cpu_load: float | None = None
    memory_budget_mb: float | None = None
    battery_pct: float | None = None
    latency_budget_ms: float | None = None
    memory_squeeze_mb: float | None = None
    # The link between device and peer (hmt.offload.proxy.LinkScenario); serve itself ignores them.
    link_bandwidth_mbit_s: float | None = None
    link_rtt_ms: float | None = None
    link_loss: float | None = None


def _read_text(path: Path | str) -> str:
    """A scenario file's text: at most ``MAX_BYTES``, UTF-8 (a byte-order mark dropped); each failure
    one InputError naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the scenario ({exc.strerror or exc})") from exc
    if len(data) > MAX_BYTES:
        raise InputError(f"{path}: over {MAX_BYTES >> 20} MiB; a scenario holds at most {MAX_ROWS} rows")
    try:
        return data.decode("utf-8-sig")  # a spreadsheet's export starts with a byte-order mark
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _cell(raw: str | None, column: str, where: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    """A cell as a number within ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``); None when empty."""
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise InputError(f"{where}: {column} {raw!r} is not a number") from exc
    if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
        bound = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise InputError(f"{where}: {column} {raw!r} outside {bound}")
    return value


class Scenario:
    """The rows of a scenario file, looked up by time."""

    def __init__(self, rows: Sequence[ScenarioRow], source: str = "scenario") -> None:
        if not rows:
            raise InputError(f"{source}: no rows")
        times = [r.time_s for r in rows]
        if any(b < a for a, b in pairwise(times)):
            raise InputError(f"{source}: time_s must be non-decreasing")
        self.rows = tuple(rows)
        self.source = source
        self._times = times

    @classmethod
    def from_csv(cls, path: Path | str) -> Scenario:
        return cls.from_text(_read_text(path), str(path))

    @classmethod
    def from_text(cls, text: str, source: str = "scenario") -> Scenario:
        # Universal newlines: a file saved with CR alone ends its lines too (csv refused it, unread).
        reader = csv.DictReader(io.StringIO(text, newline=None))
        try:
            return cls(_read_rows(reader, source), source)
        except csv.Error as exc:  # a cell past csv's field size limit: one line, not a traceback
            # line_num counts the lines read whole; the one csv stopped in is the next
            raise InputError(f"{source}:{reader.line_num + 1}: not readable as CSV ({exc})") from exc

    @property
    def end_s(self) -> float:
        return self.rows[-1].time_s

    @property
    def step_times(self) -> list[float]:
        return list(self._times)

    def at(self, time_s: float) -> ScenarioRow:
        i = bisect_right(self._times, time_s) - 1
        return self.rows[max(0, i)]


def _read_rows(reader: csv.DictReader[str], source: str) -> list[ScenarioRow]:
    """The rows of a scenario's CSV (see the module docstring), each checked and named by its line."""
    header = [h.strip() for h in (reader.fieldnames or [])]
    if "time_s" not in header:
        raise InputError(f"{source}: needs a header row with a time_s column; columns: {', '.join(COLUMNS)}")
    # One column without a name (a spreadsheet's trailing comma: 'time_s,cpu_load,') is read as
    # empty: a value under it is refused below.
    unnamed = header.count("") == 1
    unknown = [h for h in header if h not in COLUMNS and not (unnamed and h == "")]
    if unknown:
        raise InputError(f"{source}: unknown column(s) {unknown}; expected some of {list(COLUMNS)}")
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:  # DictReader keeps the last cell of a repeated name: the first would go unread
        raise InputError(f"{source}: column(s) {repeated} named more than once in the header")
    rows: list[ScenarioRow] = []
    for raw in reader:
        line = reader.line_num  # the file's line: blank lines are skipped, a quoted cell may span lines
        if len(rows) == MAX_ROWS:
            raise InputError(f"{source}: more than {MAX_ROWS} rows; a scenario holds at most {MAX_ROWS} "
                             "(the loop decides every 0.25 s: merge rows closer than that)")
        where = f"{source}:{line}"
        if None in raw:  # cells past the header's: '1,0,5' (a decimal comma) must not read as cpu_load 0
            raise InputError(f"{where}: {len(header) + len(raw[None])} cells, the header names {len(header)} "
                             "(a decimal comma? write 0.5, not 0,5)")
        record = {k.strip(): v for k, v in raw.items() if k is not None}
        if (record.get("") or "").strip():
            raise InputError(f"{where}: {record['']!r} under the column without a name; name it or remove it")
        time_s = _cell(record.get("time_s"), "time_s", where, 0.0, 1e9)
        if time_s is None:
            raise InputError(f"{where}: time_s is empty")
        if rows and time_s < rows[-1].time_s:
            raise InputError(f"{where}: time_s {time_s:g} is before the previous row's {rows[-1].time_s:g} "
                             "(times must be non-decreasing)")
        rows.append(ScenarioRow(
            time_s=time_s,
            cpu_load=_cell(record.get("cpu_load"), "cpu_load", where, 0.0, 1.0),
            memory_budget_mb=_cell(record.get("memory_budget_mb"), "memory_budget_mb", where, 0.0, 1e9, True),
            battery_pct=_cell(record.get("battery_pct"), "battery_pct", where, 0.0, 100.0),
            latency_budget_ms=_cell(record.get("latency_budget_ms"), "latency_budget_ms", where,
                                    MIN_LATENCY_BUDGET_MS, 1e9),
            memory_squeeze_mb=_cell(record.get("memory_squeeze_mb"), "memory_squeeze_mb", where, 0.0, 1e6),
            link_bandwidth_mbit_s=_cell(record.get("link_bandwidth_mbit_s"), "link_bandwidth_mbit_s", where,
                                        0.0, 1e6, True),
            link_rtt_ms=_cell(record.get("link_rtt_ms"), "link_rtt_ms", where, 0.0, 1e6),
            link_loss=_cell(record.get("link_loss"), "link_loss", where, 0.0, 0.99),
        ))
    return rows


class ScenarioState:
    """What the scenario says now (written by the driver, read by the sampler)."""

    def __init__(self) -> None:
        self.cpu_load: float | None = None
        self.battery_pct: float | None = None
        self.memory_squeeze_mb: float | None = None


class RowApplier:
    """Applies each row of a scenario once, in order, at its time, from whichever thread gets there
    first: the driver at each row's time (:meth:`through`) and the sampler at each sample
    (:meth:`due`, through :attr:`ScenarioSampler.on_sample`).

    The driver alone was late where it mattered most: in a device class at a quarter core, its thread
    waited seconds for the interpreter while serve's other threads ran, so a memory budget due at 12 s
    reached the loop at 14.2 s (once never), and the misses meanwhile were charged to the loop. The
    control thread samples every tick, so a row is applied within a tick of its time."""

    def __init__(self, rows: Sequence[ScenarioRow], apply: Callable[[ScenarioRow], object],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rows = list(rows)
        # each row's place, looked up by the row itself: a search per row made the driver quadratic in
        # the rows (the first of a row given twice, as the search found)
        self._index: dict[int, int] = {}
        for i, r in enumerate(self.rows):
            self._index.setdefault(id(r), i)
        self._apply = apply
        self._clock = clock
        self._start_s: float | None = None
        self._next = 0
        self._lock = threading.Lock()
        self.applied_on_sample = 0  # rows the sampler applied before the driver came to them
        self.driver_late_max_s = 0.0  # how late the driver came to a row at worst (a starved thread)

    @property
    def applied(self) -> int:
        """How many rows have been applied."""
        return self._next

    def start(self, start_s: float) -> None:
        """The scenario's time 0 on the monotonic clock: from then on :meth:`due` applies rows."""
        self._start_s = start_s

    def through(self, row: ScenarioRow) -> None:
        """Apply every row up to ``row`` (one of :attr:`rows`) not applied yet."""
        index = self._index[id(row)]
        if self._start_s is not None:
            late_s = self._clock() - (self._start_s + row.time_s)
            self.driver_late_max_s = max(self.driver_late_max_s, late_s)
        with self._lock:
            self._apply_to(index + 1)

    def due(self, now_s: float | None = None) -> None:
        """Apply every row whose time has come and that is not applied yet (nothing before :meth:`start`)."""
        if self._start_s is None:
            return
        now_s = self._clock() if now_s is None else now_s
        with self._lock:
            end = self._next
            while end < len(self.rows) and self._start_s + self.rows[end].time_s <= now_s:
                end += 1
            self.applied_on_sample += end - self._next
            self._apply_to(end)

    def _apply_to(self, end: int) -> None:
        while self._next < end:
            row = self.rows[self._next]
            self._next += 1  # first: a row whose application raises is not retried on every sample
            self._apply(row)


class ScenarioSampler:
    """The live sampler with the scenario's battery (and, in synthetic mode, CPU load and memory
    squeeze) laid over it. ``on_sample`` (if set) is called first, with the monotonic clock: a
    :class:`RowApplier`'s :meth:`~RowApplier.due`, so that rows are applied by the control thread too."""

    def __init__(self, state: ScenarioState, synthetic_cpu: bool, base: Sampler | None = None) -> None:
        self.state = state
        self.synthetic_cpu = synthetic_cpu
        self._base: Sampler = base if base is not None else PsutilSampler()
        self.on_sample: Callable[[float], object] | None = None

    def prime(self) -> None:
        """The live sampler's next sample measures from now (:meth:`PsutilSampler.prime`)."""
        prime = getattr(self._base, "prime", None)
        if prime is not None:
            prime()

    @property
    def cpu_source(self) -> str | None:
        """The live sampler's (:attr:`PsutilSampler.cpu_source`); None in synthetic mode, where the
        scenario's load stands in for the CPU reading."""
        if self.synthetic_cpu:
            return None
        source = getattr(self._base, "cpu_source", None)
        return source if isinstance(source, str) else None

    def use_cpu_quota(self, cores: float) -> None:
        """The live sampler reads the load against this quota (:meth:`PsutilSampler.use_cpu_quota`)."""
        use = getattr(self._base, "use_cpu_quota", None)
        if use is not None:
            use(cores)

    def __call__(self) -> ResourceSample:
        if self.on_sample is not None:
            self.on_sample(time.monotonic())
        sample = self._base()
        cpu = self.state.cpu_load
        battery = self.state.battery_pct
        if self.synthetic_cpu:
            # The synthetic load is outside load already: nothing of it is serve's own.
            sample = replace(sample, cpu_util=0.0 if cpu is None else cpu, own_cpu_util=None)
            squeeze = self.state.memory_squeeze_mb
            if squeeze:
                sample = replace(sample, mem_available_bytes=max(0, sample.mem_available_bytes - int(squeeze * 1e6)))
        if battery is not None:
            sample = replace(sample, battery_percent=battery, battery_plugged=False)
        return sample


# -- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    time_s: float  # sent, seconds since the scenario start
    status: int  # HTTP status (200 in process), 0 for a transport failure
    client_ms: float  # as the client saw it
    latency_ms: float | None  # server: queue wait + compute
    compute_ms: float | None
    variant: str | None
    exit: int | None
    predicted: int | None
    label: int | None
    latency_budget_ms: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200


Send = Callable[[np.ndarray], Tuple[int, Dict[str, Any]]]


def http_sender(url: str, token: str | None = None, timeout_s: float = 30.0) -> Callable[[], Send]:
    """A factory of per-thread senders (each keeps one keep-alive connection) to ``url``'s predict endpoint."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    headers = {"Content-Type": "application/x-npy"}
    if token:
        headers["Authorization"] = f"Bearer {token}"

    def factory() -> Send:
        conn: list[http.client.HTTPConnection] = []

        def send(x: np.ndarray) -> tuple[int, dict[str, Any]]:
            buf = io.BytesIO()
            np.save(buf, x)
            for attempt in range(2):
                if not conn:
                    fresh = http.client.HTTPConnection(host, port, timeout=timeout_s)
                    fresh.connect()
                    # http.client writes headers and body in separate sends: without NODELAY,
                    # Nagle + delayed ACK add ~40 ms to every request.
                    fresh.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn.append(fresh)
                try:
                    conn[0].request("POST", "/v1/predict", body=buf.getvalue(), headers=headers)
                    response = conn[0].getresponse()
                    body = response.read()
                    return response.status, json.loads(body) if body else {}
                except (ConnectionError, http.client.HTTPException, OSError):
                    conn.pop().close()
                    if attempt:
                        raise
            raise AssertionError("unreachable")

        return send

    return factory


CLIENT_MODES = ("threads", "processes")
# How requests arrive: evenly spaced per client; a Poisson process (exponential gaps of the same
# mean); or on/off bursts (each ONOFF_PERIOD_S, the first half at twice the rate, then nothing).
ARRIVALS = ("constant", "poisson", "onoff")
ONOFF_PERIOD_S = 1.0


@dataclass(frozen=True)
class DriveOptions:
    duration_s: float
    clients: int = 4
    rate_hz: float = 100.0  # all clients together
    load_mode: str = "synthetic"
    # "processes": each client in its own process, so the clients do not share the server's
    # interpreter lock and the server's measured latency is its own (API mode only).
    client_mode: str = "threads"
    arrivals: str = "constant"  # one of ARRIVALS, the same mean rate
    seed: int = 0  # the Poisson gaps (each client draws from its own stream)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise UsageError(f"scenario duration must be > 0 s, got {self.duration_s}")
        if self.clients < 0:
            raise UsageError(f"clients must be >= 0, got {self.clients}")
        if not (math.isfinite(self.rate_hz) and self.rate_hz > 0):
            raise UsageError(f"request rate must be > 0 Hz, got {self.rate_hz}")
        if self.load_mode not in LOAD_MODES:
            raise UsageError(f"load mode must be one of {list(LOAD_MODES)}, got {self.load_mode!r}")
        if self.client_mode not in CLIENT_MODES:
            raise UsageError(f"client mode must be one of {list(CLIENT_MODES)}, got {self.client_mode!r}")
        if self.arrivals not in ARRIVALS:
            raise UsageError(f"arrivals must be one of {list(ARRIVALS)}, got {self.arrivals!r}")


@dataclass(frozen=True)
class Inputs:
    """What the clients send: ``x[i]`` (each of the bundle's input shape) and optional labels."""

    x: np.ndarray
    y: np.ndarray | None = None


def budget_at(scenario: Scenario, base_latency_ms: float | None, time_s: float) -> float | None:
    """The latency budget in force at ``time_s``: the row's, else the base budget. Asked on every
    request: a lookup in the scenario, not a new one (checking all its rows each time)."""
    row = scenario.at(time_s)
    return row.latency_budget_ms if row.latency_budget_ms is not None else base_latency_ms


def next_arrival_s(last_s: float, period_s: float, start_s: float, arrivals: str,
                   rng: np.random.Generator | None, phase_s: float = 0.0) -> float:
    """When a client's next request is due after one due at ``last_s`` (mean gap ``period_s``);
    ``phase_s``: the client's stagger (its share of a gap), kept from one on/off cycle to the next."""
    if arrivals == "poisson":
        assert rng is not None
        return last_s + float(rng.exponential(period_s))
    if arrivals == "onoff":
        # Twice the rate in the first half of each cycle, nothing in the second: the same mean.
        due = last_s + period_s / 2
        cycle, into = divmod(due - start_s, ONOFF_PERIOD_S)
        # (a hair under the half: the sum of gaps lands on it in floating point, one send too many)
        # A new cycle starts each client at its stagger (at the doubled rate): with one start for all,
        # every client sent at the same instant for the rest of the run, bursts of as many requests
        # as clients every gap, not the doubled rate the shape means.
        return due if into < ONOFF_PERIOD_S / 2 - 1e-9 else start_s + (cycle + 1) * ONOFF_PERIOD_S + phase_s / 2
    return last_s + period_s
