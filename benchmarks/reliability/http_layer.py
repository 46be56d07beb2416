"""Reliability benchmarks of serve's HTTP layer (issue 17): loopback only, bounded in time.

    python -m benchmarks.reliability.http_layer nodelay   BUNDLE [--requests 400] [--seconds 5]
    python -m benchmarks.reliability.http_layer slowloris BUNDLE [--sockets 1500] [--seconds 40]
    python -m benchmarks.reliability.http_layer soak      BUNDLE [--clients 16] [--seconds 600] [--rate-hz 25]

``nodelay``: keep-alive p50 at the client against the server's own span (first byte in to
last byte out, from /v1/status) and its reported latency, then the throughput of 16
keep-alive client processes for ``--seconds``; both for the server as it was (proto-0
listening socket, uvicorn's plain h11 protocol: ``legacy``) and as it is (``fixed``), in
one run, on the same bundle and machine.

``slowloris``: the server runs under a 1,024-descriptor limit (soft = hard = 1024, so it
cannot raise it); ``--sockets`` connections each send a request line, then one header
line every 5 s, and reconnect when cut. A probe opens a fresh connection every 0.2 s
for GET /v1/health/live and POST /v1/predict. Reports the probe's success share,
latency and longest outage, the server's connection counters and its log volume; for
``fixed`` and, unless --skip-legacy, ``legacy`` (shorter).

``soak``: an in-process server (fixed), ``--clients`` client processes (hmt.client,
keep-alive) sending as fast as answers come (or ``--rate-hz`` each), and the latency budget flipping every
``--flip-s`` between a tight and a loose value so the loop switches variants all along.
Counts every non-200 and transport error as failed.

Results go to stdout as JSON (and to ``--out`` when given). The machine is shared with
other jobs: compare numbers of one run only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver

ROOT = Path(__file__).resolve().parents[2]


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0],
            "note": "shared with other agents' jobs; compare within one run"}


def sample_input(bundle: str) -> np.ndarray:
    from hmt.bundle import load_bundle

    spec = load_bundle(bundle).spec.input
    return np.random.default_rng(0).standard_normal(spec.shape).astype(np.float32)


def npy(x: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


# -- the server under test (a child process) ---------------------------------------------------


def server_main(args: argparse.Namespace) -> None:
    """Serve ``args.bundle`` as ``fixed`` (ApiServer) or ``legacy`` (the old transport); print the port."""
    import uvicorn

    from hmt.serve.http.api import ApiOptions, create_app
    from hmt.serve.http.server import ApiServer, ServerOptions
    from hmt.serve.running.session import SessionOptions, open_controller

    controller = open_controller(args.bundle, SessionOptions(threads=1))
    controller.start()
    app = create_app(controller, ApiOptions(max_queue=256, workers=2), on_shutdown=controller.stop)
    signal.signal(signal.SIGTERM, lambda *_: None)
    if args.mode == "fixed":
        server = ApiServer(app, ServerOptions(port=0, raise_fd_limit=True))
        print(f"port {server.port} fd_limit {server.fd_limit[1]} cap {server.guard.max_connections}", flush=True)
        server.run()
        return
    # As serve was before issue 17: a proto-0 listening socket and uvicorn's own h11 protocol.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=30, http="h11")
    print(f"port {sock.getsockname()[1]} fd_limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} cap none",
          flush=True)
    uvicorn.Server(config).run(sockets=[sock])


class ServerProcess:
    def __init__(self, bundle: str, mode: str, fd_limit: int | None = None) -> None:
        def limit() -> None:
            if fd_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, __file__, "server", bundle, "--mode", mode],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limit, env=env)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("port "):
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read(4000)!r}")
        words = line.split()
        self.port = int(words[1])
        self.info = {"mode": mode, "fd_limit": int(words[3]), "connection_cap": words[5]}
        self.log_bytes = 0
        self._drain = threading.Thread(target=self._count_log, daemon=True)
        self._drain.start()
        wait_ready(self.port)

    def _count_log(self) -> None:
        assert self.proc.stderr is not None
        while chunk := self.proc.stderr.read1(1 << 16):  # type: ignore[attr-defined]
            self.log_bytes += len(chunk)

    def stop(self) -> float:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - t0


def wait_ready(port: int, timeout_s: float = 120) -> None:
    import http.client

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/v1/health/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server never became ready")


def get_json(port: int, path: str) -> Any:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


# -- nodelay -------------------------------------------------------------------------------------


def _throughput_client(port: int, body: bytes, seconds: float, out: Any) -> None:
    from hmt.client import HmtClient, ServeError

    ok = failed = 0
    with HmtClient(f"http://127.0.0.1:{port}", timeout_s=30) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                client.predict(body)
                ok += 1
            except ServeError:
                failed += 1
    out.put((ok, failed))


def run_clients(port: int, body: bytes, clients: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_throughput_client, args=(port, body, seconds, queue)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    ok = sum(r[0] for r in results)
    return {"clients": clients, "seconds": seconds, "ok": ok, "failed": sum(r[1] for r in results),
            "req_per_s": ok / seconds}


def nodelay(args: argparse.Namespace) -> dict[str, Any]:
    import http.client

    body = npy(sample_input(args.bundle))
    out: dict[str, Any] = {"machine": machine(), "bundle": args.bundle, "modes": {}}
    for mode in ("legacy", "fixed"):
        server = ServerProcess(args.bundle, mode)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            client_ms, server_ms = [], []
            for i in range(args.requests + 20):
                t0 = time.perf_counter()
                conn.request("POST", "/v1/predict", body=body, headers={"content-type": "application/x-npy"})
                response = conn.getresponse()
                doc = json.loads(response.read())
                elapsed = (time.perf_counter() - t0) * 1e3
                if i >= 20:  # warm-up
                    client_ms.append(elapsed)
                    server_ms.append(doc["latency_ms"])
            conn.close()
            span = get_json(server.port, "/v1/status")["http"]["request_span_ms"]
            result = {**server.info, "requests": len(client_ms), "client_p50_ms": pct(client_ms, 50),
                      "client_p95_ms": pct(client_ms, 95), "server_latency_p50_ms": pct(server_ms, 50),
                      "server_span_p50_ms": span["p50"] if span else None,
                      "throughput": run_clients(server.port, body, args.clients, args.seconds)}
            result["client_minus_span_p50_ms"] = (result["client_p50_ms"] - result["server_span_p50_ms"]
                                                  if span else None)
        finally:
            server.stop()
        out["modes"][mode] = result
        print(json.dumps({mode: result}), file=sys.stderr, flush=True)
    return out


# -- slowloris -----------------------------------------------------------------------------------


def _probe(port: int, body: bytes, stop: threading.Event, period_s: float, log: list[tuple[float, str, bool, float]]
           ) -> None:
    import http.client

    t_start = time.monotonic()
    while not stop.is_set():
        for method, path, payload in (("GET", "/v1/health/live", None), ("POST", "/v1/predict", body)):
            t0 = time.monotonic()
            ok = False
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
                conn.request(method, path, body=payload, headers={"content-type": "application/x-npy"})
                ok = conn.getresponse().status == 200
                conn.close()
            except OSError:
                ok = False
            log.append((t0 - t_start, path, ok, (time.monotonic() - t0) * 1e3))
        stop.wait(period_s)


def slow_sockets(port: int, sockets: int, stop: threading.Event, stats: dict[str, int], *,
                 path: str = "/v1/predict", interval_s: float = 5.0) -> None:
    """``sockets`` slowloris connections: a request line, then a header line every ``interval_s``;
    reconnect when cut."""
    open_socks: list[socket.socket | None] = [None] * sockets

    def connect(i: int) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode())
            s.setblocking(False)
            open_socks[i] = s
            stats["connects"] += 1
        except OSError:
            stats["connect_failures"] += 1

    for i in range(sockets):
        if stop.is_set():
            break
        connect(i)
    while not stop.wait(interval_s):
        for i, s in enumerate(open_socks):
            if s is not None:
                try:
                    s.send(b"X-Slow: 1\r\n")
                    continue
                except OSError:  # cut by the server (BlockingIOError: its buffer is full, also a dead end)
                    stats["cut"] += 1
                    s.close()
                    open_socks[i] = None
            connect(i)
        stats["alive"] = sum(s is not None for s in open_socks)
    for s in open_socks:
        if s is not None:
            s.close()


def slowloris(args: argparse.Namespace) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.sockets + 256:  # the attacker needs its own descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.sockets + 1024), hard))
    body = npy(sample_input(args.bundle))
    out: dict[str, Any] = {"machine": machine(), "bundle": args.bundle, "sockets": args.sockets,
                           "server_fd_limit": 1024, "modes": {}}
    modes = [("fixed", args.seconds)] + ([] if args.skip_legacy else [("legacy", args.legacy_seconds)])
    for mode, seconds in modes:
        server = ServerProcess(args.bundle, mode, fd_limit=1024)
        stop = threading.Event()
        log: list[tuple[float, str, bool, float]] = []
        stats = {"connects": 0, "connect_failures": 0, "cut": 0, "alive": 0}
        attacker = threading.Thread(target=slow_sockets, args=(server.port, args.sockets, stop, stats), daemon=True)
        prober = threading.Thread(target=_probe, args=(server.port, body, stop, 0.2, log), daemon=True)
        attacker.start()
        time.sleep(1.0)  # let the flood open
        prober.start()
        time.sleep(seconds)
        status = None
        with contextlib.suppress(Exception):
            status = get_json(server.port, "/v1/status")["http"]["connections"]
        stop.set()
        prober.join(10)
        attacker.join(30)
        stop_s = server.stop()
        oks = [entry for entry in log if entry[2]]
        outage_s = longest_outage(log)
        result = {**server.info, "seconds": seconds, "probes": len(log), "probe_ok": len(oks),
                  "probe_ok_share": len(oks) / len(log) if log else None,
                  "probe_ok_latency_p50_ms": pct([e[3] for e in oks], 50),
                  "probe_ok_latency_p99_ms": pct([e[3] for e in oks], 99),
                  "longest_outage_s": outage_s, "attacker": stats, "server_connections": status,
                  "server_log_bytes": server.log_bytes, "shutdown_s": stop_s}
        out["modes"][mode] = result
        print(json.dumps({mode: result}), file=sys.stderr, flush=True)
    return out


def longest_outage(log: list[tuple[float, str, bool, float]]) -> float:
    """Longest time between a failed probe's start and the next success (0 when none failed)."""
    worst = 0.0
    down_since: float | None = None
    for t, _, ok, _ in sorted(log):
        if ok and down_since is not None:
            worst = max(worst, t - down_since)
            down_since = None
        elif not ok and down_since is None:
            down_since = t
    if down_since is not None and log:
        worst = max(worst, max(e[0] for e in log) - down_since)
    return worst


# -- soak ------------------------------------------------------------------------------------------


def _soak_client(port: int, body: bytes, seconds: float, rate_hz: float, out: Any) -> None:
    from hmt.client import HmtClient, ServeError

    ok = 0
    failures: dict[str, int] = {}
    latencies: list[float] = []
    variants: dict[str, int] = {}
    with HmtClient(f"http://127.0.0.1:{port}", timeout_s=30) as client:
        start = time.monotonic()
        end = start + seconds
        sent = 0
        while time.monotonic() < end:
            if rate_hz > 0:  # paced: the next send at its slot (no catching up in bursts)
                time.sleep(max(0.0, start + sent / rate_hz - time.monotonic()))
            sent += 1
            t0 = time.perf_counter()
            try:
                doc = client.predict(body)
                ok += 1
                variants[doc["variant"]] = variants.get(doc["variant"], 0) + 1
                latencies.append((time.perf_counter() - t0) * 1e3)
            except ServeError as exc:
                key = f"{exc.status}:{exc.code}"
                failures[key] = failures.get(key, 0) + 1
    out.put({"ok": ok, "failures": failures, "latencies": latencies[::10], "variants": variants})


def soak(args: argparse.Namespace) -> dict[str, Any]:
    from hmt.serve.http.api import ApiOptions, create_app
    from hmt.serve.http.server import ApiServer, ServerOptions
    from hmt.serve.running.session import SessionOptions, open_controller

    body = npy(sample_input(args.bundle))
    # Switch as soon as the budget says so (the point is switching under load, not hysteresis).
    controller = open_controller(args.bundle, SessionOptions(threads=1, serve_overrides={
        "switch": {"min_dwell_s": 0.0, "violation_patience": 1, "improve_patience": 1}}))
    controller.start()
    server = ApiServer(create_app(controller, ApiOptions(max_queue=256, workers=2, deadline_ms=5000)),
                       ServerOptions(port=0))
    server.start_background()
    variants = sorted(controller.bundle.spec.variants, key=lambda v: v.latency_ms)
    tight, loose = variants[0].latency_ms * 1.2, None  # fastest-only vs unconstrained (largest)
    stop = threading.Event()
    flips = [0]

    def flipper() -> None:
        while not stop.wait(args.flip_s):
            controller.set_budgets(tight if flips[0] % 2 == 0 else loose, None)
            flips[0] += 1

    thread = threading.Thread(target=flipper, daemon=True)
    thread.start()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_soak_client, args=(server.port, body, args.seconds, args.rate_hz, queue))
             for _ in range(args.clients)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [queue.get(timeout=args.seconds + 300) for _ in procs]
    for p in procs:
        p.join(30)
    wall_s = time.monotonic() - t0
    stop.set()
    status = controller.status(last=0)
    http_status = {"connections": server.stats.to_json_dict()}
    server.stop_background()
    controller.stop()
    failures: dict[str, int] = {}
    per_variant: dict[str, int] = {}
    for r in results:
        for k, v in r["failures"].items():
            failures[k] = failures.get(k, 0) + v
        for k, v in r["variants"].items():
            per_variant[k] = per_variant.get(k, 0) + v
    latencies = [x for r in results for x in r["latencies"]]
    ok = sum(r["ok"] for r in results)
    return {"machine": machine(), "bundle": args.bundle, "clients": args.clients, "seconds": args.seconds,
            "rate_hz_per_client": args.rate_hz,
            "wall_s": wall_s, "ok": ok, "failed": sum(failures.values()), "failures": failures,
            "req_per_s": ok / args.seconds, "client_latency_p50_ms": pct(latencies, 50),
            "client_latency_p99_ms": pct(latencies, 99), "budget_flips": flips[0], "switches": status["switches"],
            "per_variant": per_variant, "server": http_status}


BENCH = Driver(
    baseline="the server as it was (legacy socket and protocol) in the same run (nodelay); the probe "
             "alone (slowloris)",
    needs="a deploy bundle (nodelay|slowloris|soak BUNDLE)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("server")
    p.add_argument("bundle")
    p.add_argument("--mode", choices=("fixed", "legacy"), default="fixed")
    p = sub.add_parser("nodelay")
    p.add_argument("bundle")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--out", type=Path)
    p = sub.add_parser("slowloris")
    p.add_argument("bundle")
    p.add_argument("--sockets", type=int, default=1500)
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--legacy-seconds", type=float, default=20.0)
    p.add_argument("--skip-legacy", action="store_true")
    p.add_argument("--out", type=Path)
    p = sub.add_parser("soak")
    p.add_argument("bundle")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--flip-s", type=float, default=1.0)
    p.add_argument("--rate-hz", type=float, default=0.0, help="per client; 0: as fast as answers come")
    p.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "server":
        server_main(args)
        return
    result = {"nodelay": nodelay, "slowloris": slowloris, "soak": soak}[args.command](args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
