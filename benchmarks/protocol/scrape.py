"""What a Prometheus scrape costs under load: /metrics latency and the throughput it takes from predictions.

Each repetition drives one serve with closed-loop clients (hmt.client, .npy) twice for the same
time, without scraping (the baseline) and while a scraper GETs /metrics every ``--interval-s``
(0.1 s: 150 times Prometheus's usual 15 s, a stress), in alternating order. Reported: medians over
repetitions of requests/s in both phases, and of the scrape's p50/p95 latency and body size.

    python -m benchmarks.protocol.scrape [--quick] [--clients 8] [--duration-s 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.protocol.batching import drive
from benchmarks.protocol.common import ServeProcess, make_bundle, median_of, percentiles_ms, write_result


def scraping(url: str, interval_s: float, stop: threading.Event, out: dict[str, Any]) -> None:
    samples, sizes = [], []
    while not stop.is_set():
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
            sizes.append(len(response.read()))
        samples.append(time.perf_counter() - t0)
        stop.wait(max(0.0, interval_s - (time.perf_counter() - t0)))
    out.update(percentiles_ms(samples))
    out["body_bytes"] = int(np.median(sizes)) if sizes else 0


def run(argv: list[str]) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol.scrape")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s, args.reps = 2.0, 1
    width, depth = 256, 2
    x = np.random.default_rng(args.seed).standard_normal((1, width)).astype(np.float32)
    plain: list[dict[str, Any]] = []
    scraped: list[dict[str, Any]] = []
    scrapes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp) / "bundle", width, depth, seed=args.seed)
        with ServeProcess(bundle, ["--workers", "2"]) as server:
            drive(server.url, args.clients, 1.0, x)  # warm up, and give the histograms some content
            for rep in range(args.reps):
                for phase in (("plain", "scraped") if rep % 2 == 0 else ("scraped", "plain")):
                    if phase == "plain":
                        plain.append(drive(server.url, args.clients, args.duration_s, x))
                        continue
                    stop, out = threading.Event(), {}
                    scraper = threading.Thread(target=scraping, args=(server.url, args.interval_s, stop, out))
                    scraper.start()
                    scraped.append(drive(server.url, args.clients, args.duration_s, x))
                    stop.set()
                    scraper.join()
                    scrapes.append(out)
    base, loaded = median_of(plain, "requests_per_s"), median_of(scraped, "requests_per_s")
    cost = {"p50_ms_median": median_of(scrapes, "p50"), "p95_ms_median": median_of(scrapes, "p95"),
            "body_bytes": int(np.median([s["body_bytes"] for s in scrapes])), "repetitions": scrapes}
    claims = [{"claim": f"GET /metrics under load ({args.clients} clients), median of {args.reps} reps",
               "figure": f"p50 {cost['p50_ms_median']:.2f} ms, p95 {cost['p95_ms_median']:.2f} ms, "
                         f"{cost['body_bytes']} bytes"},
              {"claim": f"prediction throughput while scraping every {args.interval_s:g} s vs not scraping",
               "figure": f"{loaded:.0f} vs {base:.0f} requests/s ({100 * (loaded / base - 1):+.1f} %)"}]
    return write_result("scrape", args.quick, argv, args.seed,
                        "the same server and clients without a scraper, alternating with the scraped phase", {
                            "model": {"width": width, "depth_per_segment": depth, "segments": 2},
                            "clients": args.clients, "duration_s": args.duration_s, "interval_s": args.interval_s,
                            "reps": args.reps, "scrape": cost,
                            "requests_per_s_median": {"not_scraped": base, "scraped": loaded},
                            "not_scraped": plain, "scraped": scraped},
                        claims)


if __name__ == "__main__":
    print(run(sys.argv[1:]))
