"""On-device re-search when a budget tightens below every variant in the pool (a held-out-style scenario).

A bundle from ``hmt deploy --blocks --blocks-data`` is served in process with ``--blocks`` (the
real controller, its loop and switcher as the bundle's serve.json configures them); one client sends
labelled CIFAR-10 test images (not the bundle's calibration images) at ``--rate-hz``:

1. ``--warmup-s`` seconds with no latency budget (the loop's estimates of the variant it serves
   settle on requests as they arrive);
2. each variant of the pool is then timed *as served*: ``--probe-runs`` single requests spaced at
   the client's period, through the pool's runners, while the client keeps sending (a back-to-back
   median understates what serving measures: requests arrive apart and the loop runs between them);
3. the budget drops to ``--factor`` x the p90 of the pool's fastest variant as timed in step 2
   (``--budget-from probe``, the default): below every variant in the pool on the tail the loop
   judges feasibility on (its p95), and ``--factor`` sets how much faster a variant must be to fit;
   every mode of a repetition takes its first run's budget; it stays there for ``--after-s`` seconds.
   ``--budget-from estimates`` takes ``--factor`` x the lowest of the loop's own measured estimates of
   the pool's variants plus its serving overhead instead. On a 2-core VM the probe can read slower
   than the loop's windows (the pool then still fits and no search starts), and the estimates read
   faster than the requests' latency (``results/research_budget_estimates.json``: every request
   missed, found variants too).

Modes per repetition, in turn (``--modes``): ``research`` (serve --research, time bound
``--time-bound-s``), ``eager`` (the same search not yielding to requests: ``yield_wait_ms`` 0 and
accuracy batches of 32, how it ran before it yielded) and ``static`` (the same loop without a
search: serve runs the fastest and misses); every mode of a repetition takes its first run's budget.
Reported per mode, medians over the repetitions: the time from the budget drop until re-search
found a variant that fits and until that variant first answered; the deadline-miss share in the
window before it answered (from the drop) and after, with the share of requests the found variant
answered after; for ``static`` the same two windows (split where the research runs' found variant
first answered, median; ``--split-s`` when none did). The variant found is compared with the
pool's fastest on the bundle's calibration set (what the search used) and on the held-out test
images (the embedded CIFAR-10 test subset minus the calibration images).

    PYTHONPATH=$PWD python -m benchmarks.serve research --bundle runs/demo/bundle-blocks --reps 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver


def held_out(bundle: Any, space: Any) -> tuple[np.ndarray, np.ndarray]:
    """The embedded CIFAR-10 test subset, normalised as in training, minus the bundle's calibration images."""
    from hmt.data.load import load_dataset
    from hmt.runtime.blocks import load_calibration

    data = load_dataset("cifar10")
    mean = np.asarray(data.info.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(data.info.std, dtype=np.float32).reshape(1, -1, 1, 1)
    x = ((data.test_x.astype(np.float32) / 255.0 - mean) / std).astype(np.float32)
    y = data.test_y.astype(np.int64)
    cal_x, _ = load_calibration(bundle, space)
    shipped = {hashlib.sha256(row.tobytes()).hexdigest() for row in cal_x}
    keep = np.array([hashlib.sha256(row.tobytes()).hexdigest() not in shipped for row in x])
    return x[keep], y[keep]


def as_served(controller: Any, x: np.ndarray, runs: int, period_s: float) -> dict[str, tuple[float, float]]:
    """Each loaded variant's (p50, p90) compute time in ms as served: ``runs`` single inputs spaced
    ``period_s`` apart, early exit at the bundle's confidence as serve runs them; variants interleaved."""
    early = controller.settings.early_exit
    confidence = early.confidence if early.enabled else None
    ids = list(controller.pool.loaded_ids())
    times: dict[str, list[float]] = {a: [] for a in ids}
    for i in range(runs):
        for arch_id in ids:
            time.sleep(period_s)
            t0 = time.perf_counter()
            controller.pool.get(arch_id).run(x[i % len(x)][None], confidence)
            times[arch_id].append((time.perf_counter() - t0) * 1e3)
    return {a: (float(np.median(t)), float(np.percentile(t, 90))) for a, t in times.items()}


def pool_estimates(controller: Any) -> dict[str, float]:
    """The loop's own tail-latency estimates (ms) of the pool's variants that it has measured, plus the
    serving overhead it adds to each (the budget's share no variant can use): what it judges feasibility
    on. A budget below all of them is one that no variant in the pool meets."""
    estimates = controller.status().get("estimates") or {}
    overhead_ms = float(controller.overhead_ms)
    return {a: float(e["latency_ms"]) + overhead_ms for a, e in estimates.items() if e.get("source") == "measured"}


def one_run(bundle_path: Path, mode: str, args: argparse.Namespace, seed: int, x: np.ndarray, y: np.ndarray,
            split_s: float | None = None, budget_ms: float | None = None) -> dict[str, Any]:
    from hmt.serve.deciding.research import ResearchSettings
    from hmt.serve.running.session import SessionOptions, open_controller

    research = None
    if mode == "research":
        research = ResearchSettings(time_bound_s=args.time_bound_s, seed=seed)
    elif mode == "eager":  # the search not yielding to the requests served meanwhile
        research = ResearchSettings(time_bound_s=args.time_bound_s, seed=seed, yield_wait_ms=0.0, accuracy_batch=32)
    controller = open_controller(bundle_path, SessionOptions(blocks=True, research=research))
    controller.start(background=True)
    records: list[tuple[float, float, bool, str, bool]] = []
    stop = threading.Event()
    try:
        def client() -> None:
            period = 1.0 / args.rate_hz
            i = 0
            while not stop.is_set():
                t0 = time.monotonic()
                p = controller.predict(x[i % len(x)][None])
                records.append((t0, p.latency_ms, p.deadline_miss, p.variant, p.class_index == int(y[i % len(x)])))
                i += 1
                stop.wait(max(0.0, period - (time.monotonic() - t0)))

        thread = threading.Thread(target=client, daemon=True)
        start = time.monotonic()
        thread.start()
        time.sleep(args.warmup_s)
        served = as_served(controller, x, args.probe_runs, 1.0 / args.rate_hz)
        fastest_id = min(served, key=lambda a: served[a][0])
        estimated = pool_estimates(controller)
        if budget_ms is None:
            budget_ms = args.factor * (served[fastest_id][1] if args.budget_from == "probe" or not estimated
                                       else min(estimated.values()))
        drop = time.monotonic()
        controller.set_budgets(latency_ms=budget_ms, memory_mb=None)
        time.sleep(args.after_s)
        stop.set()
        thread.join(10.0)
        status = controller.status()
    finally:
        stop.set()
        controller.stop()
    last = (status.get("research") or {}).get("last") or {}
    found = (last.get("found") or {}).get("arch_id")
    found_at = None
    if found is not None and last.get("found_after_s") is not None:
        found_at = controller.t0_s + last["started_s"] + last["found_after_s"]
    served_at = next((t for t, _, _, v, _ in records if t >= drop and v == found), None) if found else None
    split = served_at if served_at is not None else drop + (args.split_s if split_s is None else split_s)
    before = [m for t, _, m, _, _ in records if drop <= t < split]
    after = [(m, v, lat) for t, lat, m, v, _ in records if t >= split]
    after_ms = [lat for _, _, lat in after]
    return {
        "mode": mode, "seed": seed, "budget_ms": budget_ms, "pool_fastest": fastest_id,
        "pool_fastest_p50_ms": served[fastest_id][0], "pool_fastest_p90_ms": served[fastest_id][1],
        "as_served_ms": {a.split(".", 1)[-1]: [round(p50, 4), round(p90, 4)] for a, (p50, p90) in served.items()},
        "loop_estimates_ms": {a.split(".", 1)[-1]: round(v, 4) for a, v in estimated.items()},
        "requests": len(records), "before_drop_requests": sum(t < drop for t, *_ in records),
        "found": found, "search_started_after_drop_s": None if not last else
        controller.t0_s + last["started_s"] - drop,
        "found_after_drop_s": None if found_at is None else found_at - drop,
        "served_after_drop_s": None if served_at is None else served_at - drop,
        "search_evaluated": last.get("evaluated"), "search_fastest_ms": last.get("fastest_ms"),
        "search_fastest": last.get("fastest_arch_id"), "unconfirmed": last.get("unconfirmed_arch_id"),
        "confirmed_speed_ratio": last.get("confirmed_speed_ratio"),
        "latency_limit_ms": last.get("latency_limit_ms"),
        "search_s": None if not last else last["ended_s"] - last["started_s"],
        "serving_ratio": last.get("serving_ratio"), "active_estimate_ms": last.get("active_estimate_ms"),
        "search_yielded_s": (status.get("research") or {}).get("yielded_s"),
        "search_timed_runs_rerun": (status.get("research") or {}).get("timed_runs_rerun"),
        "found_calibration_accuracy": (last.get("found") or {}).get("accuracy"),
        "miss_share_before": float(np.mean(before)) if before else None, "requests_before": len(before),
        "miss_share_after": float(np.mean([m for m, _, _ in after])) if after else None, "requests_after": len(after),
        "found_share_after": float(np.mean([v == found for _, v, _ in after])) if after and found else None,
        "after_by_variant": by_variant(after),
        "after_p50_ms": float(np.median(after_ms)) if after_ms else None,
        "after_p95_ms": float(np.percentile(after_ms, 95)) if after_ms else None,
        "split_after_drop_s": split - drop, "elapsed_s": time.monotonic() - start,
    }


def by_variant(requests: list[tuple[bool, str, float]]) -> dict[str, dict[str, float]]:
    """Per variant that answered (arch id without its space tag): requests, miss share, p50 and p95 (ms)."""
    out: dict[str, dict[str, float]] = {}
    for variant in sorted({v for _, v, _ in requests}):
        mine = [(m, lat) for m, v, lat in requests if v == variant]
        lat = [t for _, t in mine]
        out[variant.split(".", 1)[-1]] = {"requests": len(mine), "miss_share": float(np.mean([m for m, _ in mine])),
                                          "p50_ms": float(np.median(lat)), "p95_ms": float(np.percentile(lat, 95))}
    return out


def accuracy_of(bundle_path: Path, arch_ids: list[str], x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    from hmt.bundle import load_bundle
    from hmt.runtime.blocks import BlockStore, accuracy_on, compose, load_block_space

    bundle = load_bundle(bundle_path)
    space = load_block_space(bundle)
    store = BlockStore(bundle, space)
    return {a: accuracy_on(compose(store, space.parse(a)), x, y) for a in arch_ids}


def median(values: list[Any]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hmt.bundle import load_bundle
    from hmt.runtime.blocks import BlockStore, accuracy_on, compose, load_block_space, load_calibration

    bundle = load_bundle(args.bundle)
    space = load_block_space(bundle)
    x, y = held_out(bundle, space)
    runs: list[dict[str, Any]] = []
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for rep in range(args.reps):  # research first: the static run of a repetition splits where it served
        first = len(runs)
        for mode in modes:
            found = [r["served_after_drop_s"] for r in runs if r["mode"] == "research"
                     and r["served_after_drop_s"] is not None]
            # every mode takes the first run's budget of the same repetition: the same scenario
            budget = runs[first]["budget_ms"] if len(runs) > first else None
            runs.append(one_run(args.bundle, mode, args, args.seed + rep, x[:args.client_images],
                                y[:args.client_images], split_s=median(found) if mode == "static" else None,
                                budget_ms=budget))
    research = [r for r in runs if r["mode"] == "research"]
    eager = [r for r in runs if r["mode"] == "eager"]
    static = [r for r in runs if r["mode"] == "static"]
    # the found variant vs the pool's fastest: on the calibration set (the search's measure) and held out
    found = sorted({r["found"] for r in research + eager if r["found"]})
    fastest = sorted({r["pool_fastest"] for r in runs})
    cal_x, cal_y = load_calibration(bundle, space)
    store = BlockStore(bundle, space)
    calibration = {a: accuracy_on(compose(store, space.parse(a)), cal_x, cal_y) for a in [*found, *fastest]}
    held = accuracy_of(args.bundle, [*found, *fastest], x, y)  # no image here chose anything
    searched = ("budget_ms", "pool_fastest_p50_ms", "pool_fastest_p90_ms", "found_after_drop_s", "served_after_drop_s",
                "search_s", "search_evaluated", "search_fastest_ms", "serving_ratio", "latency_limit_ms",
                "miss_share_before", "miss_share_after", "found_share_after", "after_p50_ms", "after_p95_ms",
                "split_after_drop_s", "search_yielded_s", "search_timed_runs_rerun")
    summary = {
        "research": {key: median([r[key] for r in research]) for key in searched},
        "eager": {key: median([r[key] for r in eager]) for key in searched},
        "static": {key: median([r[key] for r in static]) for key in (
            "budget_ms", "pool_fastest_p50_ms", "pool_fastest_p90_ms", "miss_share_before", "miss_share_after",
            "after_p50_ms", "after_p95_ms", "split_after_drop_s")},
        "found_in": f"{sum(1 for r in research if r['found'])}/{len(research)} searches",
        "eager_found_in": f"{sum(1 for r in eager if r['found'])}/{len(eager)} searches",
    }
    notes = ["budget and misses are per request against the latency budget; the loop judges feasibility on a p95 "
             "of served requests, so a budget below the pool's fastest p90 is infeasible for the whole pool while "
             "most of its requests still answer in time",
             "the search runs on the serving CPU: it waits for no request in flight before each timed run and "
             "accuracy batch (at most yield_wait_ms) and runs a timed run again when a request started beside it; "
             "eager runs the same search without yielding (the research and eager runs' 'before' windows hold the "
             "search, the static runs' does not)",
             "an earlier form of this benchmark read 100% misses after the found variant served: once the found "
             "variant was active, the shadow runs looked it up in the bundle's table, raised, and ended the control "
             "thread, so the loop stopped deciding; adopt now gives them the extended table and a failed shadow run "
             "no longer ends the loop"]
    return {"summary": summary, "runs": runs, "calibration_accuracy": calibration, "notes": notes,
            "held_out_accuracy": held, "held_out_images": len(y),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}}


MODES = ("research", "eager", "static")
RUN_KEYS = ("mode", "seed", "budget_ms", "pool_fastest", "pool_fastest_p50_ms", "pool_fastest_p90_ms", "found",
            "search_yielded_s", "search_timed_runs_rerun",
            "search_started_after_drop_s", "found_after_drop_s", "served_after_drop_s", "search_evaluated",
            "search_fastest_ms", "serving_ratio", "miss_share_before", "requests_before", "miss_share_after",
            "requests_after", "found_share_after", "after_p50_ms", "after_p95_ms", "split_after_drop_s",
            "loop_estimates_ms", "search_fastest", "unconfirmed", "confirmed_speed_ratio", "latency_limit_ms")


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """The summary and one row per run (its figures, no per-request trace)."""
    rows = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in run.items() if k in RUN_KEYS}
            for run in report["runs"]]
    modes = len({run["mode"] for run in report["runs"]}) or 1
    return {k: v for k, v in report.items() if k != "runs"} | {"repetitions": len(report["runs"]) // modes,
                                                                 "runs": rows}


def claims(report: dict[str, Any]) -> list[dict[str, str]]:
    s, r, st = report["summary"], report["summary"]["research"], report["summary"]["static"]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} s"

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} ms"

    out = [{"claim": "the budget: factor x the p90 of the pool's fastest variant timed as served after the warm-up "
                     "(its p50 / p90), median",
            "figure": f"{ms(r['budget_ms'])} ({ms(r['pool_fastest_p50_ms'])} / {ms(r['pool_fastest_p90_ms'])})"},
           {"claim": "time from the budget drop until re-search found a variant that fits / until it served "
                     "(median)", "figure": f"{sec(r['found_after_drop_s'])} / {sec(r['served_after_drop_s'])} "
                                           f"({s['found_in']})"},
           {"claim": "deadline-miss share before / after the found variant first served, with re-search "
                     "(share of requests after that the found variant answered)",
            "figure": f"{pct(r['miss_share_before'])} / {pct(r['miss_share_after'])} "
                      f"({pct(r['found_share_after'])})"},
           {"claim": "the same windows without re-search (static: serves the pool's fastest)",
            "figure": f"{pct(st['miss_share_before'])} / {pct(st['miss_share_after'])}"}]
    ea = s.get("eager") or {}
    if ea.get("budget_ms") is not None:
        out.append({"claim": "the same windows with a search that does not yield to requests (eager, in the same run): "
                             "misses before / after; found / served after the drop",
                    "figure": f"{pct(ea['miss_share_before'])} / {pct(ea['miss_share_after'])}; "
                              f"{sec(ea['found_after_drop_s'])} / {sec(ea['served_after_drop_s'])} "
                              f"({s.get('eager_found_in')})"})
    out += [{"claim": "request latency after the split, p50 / p95: with re-search vs static",
             "figure": f"{ms(r['after_p50_ms'])} / {ms(r['after_p95_ms'])} vs "
                       f"{ms(st['after_p50_ms'])} / {ms(st['after_p95_ms'])}"},
            {"claim": "the serving ratio the search scaled candidates' medians by (the loop's measured estimate of "
                      "the start variant over its timed median), median",
             "figure": "-" if r["serving_ratio"] is None else f"{r['serving_ratio']:.2f}"}]
    out.extend({"claim": note, "figure": "-"} for note in report.get("notes", []))
    held, cal = report["held_out_accuracy"], report["calibration_accuracy"]
    fastest = sorted({run["pool_fastest"] for run in report["runs"]})
    found = sorted({run["found"] for run in report["runs"] if run["found"]})
    for arch in found:
        out.append({"claim": f"accuracy of a found variant vs the pool's fastest ({arch.split('.', 1)[1]} vs "
                             f"{', '.join(f.split('.', 1)[1] for f in fastest)}), held out / calibration set",
                    "figure": f"{pct(held[arch])} vs {', '.join(pct(held[f]) for f in fastest)} / "
                              f"{pct(cal[arch])} vs {', '.join(pct(cal[f]) for f in fastest)}"})
    return out


BENCH = Driver(
    baseline="the same scenario without re-search (static), alternating with it in the same run",
    needs="a bundle from hmt deploy --blocks --blocks-data (--bundle)",
    summarise=summarise,
    claims=claims,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="a bundle from hmt deploy --blocks --blocks-data")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup-s", type=float, default=10.0, help="no budget, before the variants are timed")
    parser.add_argument("--probe-runs", type=int, default=40, help="requests per variant timed as served")
    parser.add_argument("--after-s", type=float, default=35.0)
    parser.add_argument("--time-bound-s", type=float, default=15.0)
    parser.add_argument("--factor", type=float, default=0.8,
                        help="budget = factor x the lowest of the loop's measured estimates of the pool's variants, "
                             "with its serving overhead (--budget-from estimates), or x the p90 of the pool's "
                             "fastest as probed (probe)")
    parser.add_argument("--budget-from", choices=("estimates", "probe"), default="probe",
                        help="probe (default): the pool's fastest timed as single runs 1/rate apart; estimates: the "
                             "loop's own measured estimates of the pool plus its serving overhead (see the docstring "
                             "for what each read on a 2-core VM)")
    parser.add_argument("--split-s", type=float, default=15.0,
                        help="where 'before' ends when nothing found serves (static, or a failed search)")
    parser.add_argument("--rate-hz", type=float, default=20.0)
    parser.add_argument("--client-images", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="research,eager,static",
                        help="modes per repetition, in this order (research first: static splits where it served)")
    parser.add_argument("--out", type=Path, default=None, help="write the report here (JSON)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES) or len(set(modes)) != len(modes):
        parser.error(f"--modes: expected distinct modes among {', '.join(MODES)}, got {args.modes!r}")
    report = run(args)
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
