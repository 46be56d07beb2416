"""Dynamic batching at 16 concurrent clients: throughput and client-side p95, with and without.

Each repetition starts serve twice on the same bundle (graphs that take a batch), without
batching (the baseline, ``--dynamic-batch 1``) and with ``--dynamic-batch N --dynamic-batch-delay-ms D``,
in alternating order, and drives each for the same time with 16 closed-loop clients (threads, one
kept-alive connection each, hmt.client with .npy bodies). Reported: medians over repetitions of
requests/s and of the client-side p50/p95/p99, and the server's mean batch.

    python -m benchmarks.protocol.batching [--quick] [--clients 16] [--duration-s 15] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.protocol.common import ServeProcess, make_bundle, median_of, percentiles_ms, write_result


def drive(url: str, clients: int, duration_s: float, x: np.ndarray) -> dict[str, Any]:
    """``clients`` closed-loop threads for ``duration_s``; requests/s and client-side latency."""
    from hmt.client import HmtClient

    samples: list[list[float]] = [[] for _ in range(clients)]
    failures = [0] * clients
    start = threading.Event()
    stop_at = [0.0]

    def client(i: int) -> None:
        with HmtClient(url, report_latency=False) as c:
            c.predict(x)  # connect and warm before the clock starts
            start.wait()
            while time.perf_counter() < stop_at[0]:
                t0 = time.perf_counter()
                try:
                    c.predict(x)
                except Exception:  # noqa: BLE001 - counted, not fatal
                    failures[i] += 1
                    continue
                samples[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    stop_at[0] = t0 + duration_s
    start.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    flat = [s for per in samples for s in per]
    return {"requests_per_s": len(flat) / elapsed, "failed": sum(failures), **percentiles_ms(flat)}


def run(argv: list[str]) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol.batching")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=2.0)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s, args.reps = 2.0, 1
    x = np.random.default_rng(args.seed).standard_normal((1, args.width)).astype(np.float32)
    configs = {"off": ["--workers", str(args.workers)],
               "on": ["--workers", str(args.workers), "--dynamic-batch", str(args.max_batch),
                      "--dynamic-batch-delay-ms", str(args.delay_ms)]}
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    lone: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}  # one client: what the delay costs alone
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp) / "bundle", args.width, args.depth, seed=args.seed)
        for rep in range(args.reps):
            for name in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                with ServeProcess(bundle, configs[name]) as server:
                    result = drive(server.url, args.clients, args.duration_s, x)
                    batching = server.status()["batching"]
                    lone[name].append(drive(server.url, 1, args.duration_s / 3, x))
                result["mean_batch"] = batching.get("mean_batch")
                result["variants_take_a_batch"] = batching.get("variants_take_a_batch")
                runs[name].append(result)
    summary = {name: {"requests_per_s_median": median_of(r, "requests_per_s"), "p50_ms_median": median_of(r, "p50"),
                      "p95_ms_median": median_of(r, "p95"), "p99_ms_median": median_of(r, "p99"),
                      "repetitions": r} for name, r in runs.items()}
    off, on = summary["off"], summary["on"]
    speedup = on["requests_per_s_median"] / off["requests_per_s_median"]
    wins = speedup > 1.05 and on["p95_ms_median"] <= off["p95_ms_median"]
    claims = [{"claim": f"dynamic batching (max {args.max_batch}, {args.delay_ms:g} ms) vs none, {args.clients} "
                        f"concurrent clients, median of {args.reps} reps: throughput",
               "figure": f"{on['requests_per_s_median']:.0f} vs {off['requests_per_s_median']:.0f} requests/s "
                         f"({speedup:.2f}x)"},
              {"claim": "client-side p95 with vs without batching",
               "figure": f"{on['p95_ms_median']:.2f} ms vs {off['p95_ms_median']:.2f} ms"},
              {"claim": "one client alone: p50 with vs without batching (a lone request waits up to the delay)",
               "figure": f"{median_of(lone['on'], 'p50'):.2f} ms vs {median_of(lone['off'], 'p50'):.2f} ms"},
              {"claim": "throughput gain above 5 % with p95 no worse, at 16 clients",
               "figure": "yes" if wins else "no"}]
    return write_result("batching", args.quick, argv, args.seed,
                        "the same server and bundle without dynamic batching (--dynamic-batch 1), alternating with "
                        "the batched server in each repetition", {
                            "model": {"width": args.width, "depth_per_segment": args.depth, "segments": 2,
                                      "early_exit": False},
                            "clients": args.clients, "duration_s": args.duration_s, "reps": args.reps,
                            "workers": args.workers, "max_batch": args.max_batch, "delay_ms": args.delay_ms,
                            "off": off, "on": on, "throughput_ratio": speedup, "batching_wins": wins,
                            "one_client": {name: {"p50_ms_median": median_of(r, "p50"),
                                                  "p95_ms_median": median_of(r, "p95"),
                                                  "requests_per_s_median": median_of(r, "requests_per_s")}
                                           for name, r in lone.items()}},
                        claims)


if __name__ == "__main__":
    print(run(sys.argv[1:]))
