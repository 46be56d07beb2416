"""What a Prometheus scrape costs under load: /metrics latency and the throughput it takes from predictions.

Each repetition drives one serve with closed-loop clients (hmt.client, .npy) for the same time
without scraping (the baseline) and while a scraper GETs /metrics every 0.1 s (150 times
Prometheus's usual 15 s, a stress) and every 1 s, in rotating order. Reported: medians over
repetitions of requests/s and of the server's CPU time per request (its process_cpu_seconds_total)
in each phase, and of the scrape's p50/p95 latency and body size.

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


def server_cpu_s(url: str) -> float:
    """The serve process's CPU seconds so far (its own process_cpu_seconds_total)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("process_cpu_seconds_total "):
                return float(line.split()[1])
    raise RuntimeError("no process_cpu_seconds_total in /metrics")


def phase(url: str, clients: int, duration_s: float, x: np.ndarray, interval_s: float | None) -> dict[str, Any]:
    """One closed-loop phase, scraped every ``interval_s`` (None: not scraped); with the server's CPU."""
    stop, scrape = threading.Event(), {}
    scraper = None
    if interval_s is not None:
        scraper = threading.Thread(target=scraping, args=(url, interval_s, stop, scrape))
    cpu0 = server_cpu_s(url)
    if scraper is not None:
        scraper.start()
    result = drive(url, clients, duration_s, x)
    stop.set()
    if scraper is not None:
        scraper.join()
    cpu = server_cpu_s(url) - cpu0
    result["server_cpu_ms_per_request"] = 1e3 * cpu / max(1, result["count"])
    result["scrape"] = scrape or None
    return result


def render_cpu_ms(bundle: Path, renders: int) -> dict[str, float]:
    """CPU time of one /metrics render (this thread's time, so other load does not count), after 500
    predictions have filled the histograms: the scrape's own cost, apart from waiting for the CPU."""
    from hmt.bundle import load_bundle
    from hmt.serve.controller import Controller
    from hmt.serve.reporting.metrics import ServeMetrics

    controller = Controller(load_bundle(bundle), warmup_runs=1)
    controller.start(background=False)
    metrics = ServeMetrics(controller, http_counts={("/v1/predict", 200): 500}, queue=lambda: {
        "admitted": 0, "max_queue": 64, "rejected_full": 0, "deadline_expired": 0})
    x = np.zeros((1, *controller.bundle.spec.input.shape[1:]), np.float32)
    metrics.observe_predictions([controller.predict(x) for _ in range(500)])
    times = []
    for _ in range(renders):
        t0 = time.thread_time()
        metrics.text()
        times.append((time.thread_time() - t0) * 1e3)
    controller.stop()
    return {"median": float(np.median(times)), "p95": float(np.percentile(times, 95)), "renders": renders}


def run(argv: list[str]) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol.scrape")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--intervals-s", default="0.1,1.0", help="scrape intervals to compare with none")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration_s, args.reps = 2.0, 1
    intervals = [float(v) for v in args.intervals_s.split(",")]
    width, depth = 256, 2
    x = np.random.default_rng(args.seed).standard_normal((1, width)).astype(np.float32)
    names = ["not_scraped", *(f"every_{v:g}_s" for v in intervals)]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp) / "bundle", width, depth, seed=args.seed)
        render = render_cpu_ms(bundle, 40 if args.quick else 400)
        with ServeProcess(bundle, ["--workers", "2"]) as server:
            drive(server.url, args.clients, 1.0, x)  # warm up, and give the histograms some content
            for rep in range(args.reps):
                order = list(zip(names, [None, *intervals], strict=True))
                for name, interval in order[rep % len(order):] + order[:rep % len(order)]:
                    runs[name].append(phase(server.url, args.clients, args.duration_s, x, interval))
    summary: dict[str, Any] = {}
    for name, r in runs.items():
        summary[name] = {"requests_per_s_median": median_of(r, "requests_per_s"),
                         "server_cpu_ms_per_request_median": median_of(r, "server_cpu_ms_per_request"),
                         "repetitions": r}
        if r[0]["scrape"]:
            scrapes = [x["scrape"] for x in r]
            summary[name].update({"scrape_p50_ms_median": median_of(scrapes, "p50"),
                                  "scrape_p95_ms_median": median_of(scrapes, "p95"),
                                  "scrape_body_bytes": int(np.median([s["body_bytes"] for s in scrapes]))})
    base = summary["not_scraped"]
    claims = [{"claim": "CPU time of one /metrics render (thread time, in process, histograms filled)",
               "figure": f"median {render['median']:.2f} ms, p95 {render['p95']:.2f} ms over {render['renders']}"}]
    for name in names[1:]:
        got = summary[name]
        claims.append({"claim": f"GET /metrics {name.replace('_', ' ')} under load ({args.clients} clients), "
                                f"median of {args.reps} reps",
                       "figure": f"p50 {got['scrape_p50_ms_median']:.2f} ms, p95 {got['scrape_p95_ms_median']:.2f} ms, "
                                 f"{got['scrape_body_bytes']} bytes"})
        claims.append({"claim": f"prediction throughput and server CPU per request, scraped {name.replace('_', ' ')} "
                                "vs not scraped",
                       "figure": f"{got['requests_per_s_median']:.0f} vs {base['requests_per_s_median']:.0f} "
                                 f"requests/s; {got['server_cpu_ms_per_request_median']:.3f} vs "
                                 f"{base['server_cpu_ms_per_request_median']:.3f} ms CPU per request"})
    return write_result("scrape", args.quick, argv, args.seed,
                        "the same server and clients without a scraper, alternating with the scraped phases", {
                            "model": {"width": width, "depth_per_segment": depth, "segments": 2},
                            "clients": args.clients, "duration_s": args.duration_s, "intervals_s": intervals,
                            "reps": args.reps, "render_cpu_ms": render, "phases": summary}, claims)


if __name__ == "__main__":
    print(run(sys.argv[1:]))
