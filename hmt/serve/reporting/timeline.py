"""What a scenario run did: the summary numbers, the timeline CSVs and the plot (CrowdHMTware Fig. 13).

A request *misses* its deadline when it failed or its server latency (queue wait +
compute) exceeded the latency budget in force when it was sent; requests sent with no
budget are not judged. After each step of the scenario, *back within budget* is the
time from the step to the first judged request that starts a run of ``clean_run``
requests all within budget (0 when the step causes no miss; ``None`` when that never
happens before the next step). Two readings of "back within budget" after each step:

- ``first_clean_window_s``: issue 14's target, "the first 0.5 s window after each step with
  at most 5% misses": the start of the first such window (windows start at each judged
  request), relative to the step;
- ``back_within_budget_s``: stricter, the end of the *last* bad window in the step's
  interval (any later spike counts, whatever the loop did about it).
"""

from __future__ import annotations

import csv
import dataclasses
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hmt.compat import strict_zip
from hmt.serve.controller import TickRecord
from hmt.serve.running.scenario import RequestRecord

WINDOW_S = 0.5
MAX_MISS_SHARE = 0.05


def _missed(r: RequestRecord) -> bool:
    assert r.latency_budget_ms is not None
    return not r.ok or r.latency_ms is None or r.latency_ms > r.latency_budget_ms


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean()), "max": float(a.max())}


def recovery(records: Sequence[RequestRecord], step_times: Sequence[float], end_s: float,
             window_s: float = WINDOW_S, max_miss_share: float = MAX_MISS_SHARE) -> list[dict[str, Any]]:
    """Per scenario step after the first: misses in its interval and the time back within budget.

    A ``window_s`` window of judged requests is *bad* when more than ``max_miss_share`` of
    them (and at least two) missed. Back within budget = the end of the last bad window
    that starts in the step's interval, minus the step time (0 when there is none);
    ``None`` when a bad window still reaches the next step (it never settled).
    """
    out: list[dict[str, Any]] = []
    bounds = [*step_times[1:], end_s]
    # Each step's requests by bisection over the judged ones in time order: a scan of every request
    # per step took minutes on a scenario of thousands of rows.
    judged = sorted((r for r in records if r.latency_budget_ms is not None), key=lambda r: r.time_s)
    sent = [r.time_s for r in judged]
    for start, stop in strict_zip(step_times[1:], bounds[1:]):
        if stop <= start:
            continue
        window = judged[bisect_left(sent, start):bisect_left(sent, stop)]
        missed = [_missed(r) for r in window]
        entry: dict[str, Any] = {"time_s": start, "judged": len(window), "misses": int(sum(missed)),
                                 "back_within_budget_s": 0.0}
        times = [r.time_s for r in window]
        last_bad_end: float | None = None
        first_clean: float | None = None
        j = 0
        for i, t in enumerate(times):
            while j < len(times) and times[j] < t + window_s:
                j += 1
            count, bad = j - i, sum(missed[i:j])
            if bad >= 2 and bad > max_miss_share * count:
                last_bad_end = t + window_s
            elif first_clean is None and t + window_s <= stop:
                first_clean = t - start
        entry["first_clean_window_s"] = first_clean
        if last_bad_end is not None:
            entry["back_within_budget_s"] = None if last_bad_end >= stop else last_bad_end - start
        out.append(entry)
    return out


def summarize(records: Sequence[RequestRecord], ticks: Sequence[TickRecord], step_times: Sequence[float],
              end_s: float, switches: int) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    judged = [r for r in records if r.latency_budget_ms is not None]
    labelled = [r for r in ok if r.label is not None]
    ratios = [r.latency_ms / r.latency_budget_ms for r in ok
              if r.latency_budget_ms is not None and r.latency_ms is not None]
    steps = recovery(records, step_times, end_s)
    backs = [s["back_within_budget_s"] for s in steps if s["back_within_budget_s"] is not None]
    cleans = [s["first_clean_window_s"] for s in steps if s["judged"]]
    budgets_client = [(r.client_ms, r.latency_budget_ms) for r in judged if r.ok and r.latency_budget_ms is not None]
    decisions = [t.decision_us for t in ticks]
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "failed_by_status": dict(Counter(str(r.status) for r in records if not r.ok)),
        "latency_ms": _quantiles([r.latency_ms for r in ok if r.latency_ms is not None]),
        "compute_ms": _quantiles([r.compute_ms for r in ok if r.compute_ms is not None]),
        "client_ms": _quantiles([r.client_ms for r in ok]),
        "latency_over_budget": _quantiles(ratios),
        "judged": len(judged),
        "deadline_misses": sum(_missed(r) for r in judged),
        "deadline_miss_share": (sum(_missed(r) for r in judged) / len(judged)) if judged else None,
        "accuracy": (sum(r.predicted == r.label for r in labelled) / len(labelled)) if labelled else None,
        "labelled": len(labelled),
        "switches": switches,
        "decisions": len(ticks),
        "decision_us": _quantiles(decisions),
        "estimate_us": _quantiles([t.estimate_us for t in ticks]),
        "decision_cpu_us": _quantiles([t.decision_cpu_us for t in ticks]),
        "per_exit": {str(k): v for k, v in sorted(Counter(r.exit for r in ok).items(), key=lambda kv: str(kv[0]))},
        "per_variant": dict(Counter(r.variant for r in ok if r.variant is not None)),
        "steps": steps,
        "back_within_budget_s_max": max(backs) if backs else None,
        "steps_never_back": sum(1 for s in steps if s["judged"] and s["back_within_budget_s"] is None),
        # None: a step whose interval never had a clean window (shown as such, not dropped).
        "first_clean_window_s_max": (None if any(c is None for c in cleans) else max(cleans)) if cleans else None,
        "steps_never_clean": sum(1 for c in cleans if c is None),
        # The same budget judged on the latency the client measured (keep-alive HTTP, its own clock).
        "client_over_budget_share": (sum(c > b for c, b in budgets_client) / len(budgets_client))
        if budgets_client else None,
    }


# The files a replay writes in --timeline-out; a folder holding one of these names that hmt did not
# write (a summary.json of the user's) is refused, not overwritten (see :func:`is_timeline_file`).
TIMELINE_FILES = ("timeline.csv", "requests.csv", "timeline.png", "summary.json")
_SUMMARY_KEYS = frozenset({"label", "via", "duration_s", "requests", "clients"})


def is_timeline_file(path: Path) -> bool:
    """Whether ``path`` (named as one of :data:`TIMELINE_FILES`) is what a replay writes there: the CSVs
    start with their records' header (or are empty), the summary holds a replay's keys, the plot is
    matplotlib's PNG."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    if path.name in ("timeline.csv", "requests.csv"):
        record = TickRecord if path.name == "timeline.csv" else RequestRecord
        header = ",".join(f.name for f in dataclasses.fields(record)).encode()
        return head == b"" or head.startswith(header + b"\r\n") or head.startswith(header + b"\n")
    if path.name == "timeline.png":
        return head.startswith(b"\x89PNG") and b"Matplotlib" in head
    if path.name == "summary.json":
        import json

        try:
            doc = json.loads(path.read_bytes()) if path.stat().st_size < 64 << 20 else None
        except (ValueError, RecursionError):
            return False
        return isinstance(doc, dict) and doc.keys() >= _SUMMARY_KEYS
    return False


def write_csv(path: Path, rows: Sequence[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        if not rows:
            return path
        names = [f.name for f in dataclasses.fields(rows[0])]
        writer = csv.writer(handle)
        writer.writerow(names)
        for row in rows:
            writer.writerow(["" if getattr(row, n) is None else getattr(row, n) for n in names])
    return path


def plot_timeline(path: Path, records: Sequence[RequestRecord], ticks: Sequence[TickRecord],
                  title: str = "hmt serve scenario") -> Path | None:
    """Load, battery, budget, chosen variant and latency over time; ``None`` when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    t = [k.time_s for k in ticks]
    ax = axes[0]
    ax.step(t, [k.cpu_util for k in ticks], where="post", label="CPU use")
    ax.step(t, [k.load_index for k in ticks], where="post", label="load index I")
    ax.plot(t, [k.load_forecast for k in ticks], ".", ms=3, label="forecast of I")
    ax.set_ylabel("share")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    ax.step(t, [np.nan if k.battery_percent is None else k.battery_percent for k in ticks], where="post",
            label="battery %")
    ax.step(t, [100 * k.mu for k in ticks], where="post", label="mu x 100")
    mem = [np.nan if k.memory_budget_mb is None else k.memory_budget_mb for k in ticks]
    twin = ax.twinx()
    twin.step(t, mem, where="post", color="tab:red", label="memory budget MB")
    twin.set_ylabel("MB")
    ax.set_ylabel("%")
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    ok = [r for r in records if r.ok and r.latency_ms is not None]
    miss = [r for r in ok if r.latency_budget_ms is not None and r.latency_ms > r.latency_budget_ms]  # type: ignore
    ax.plot([r.time_s for r in ok], [r.latency_ms for r in ok], ".", ms=2, alpha=0.5, label="latency (server)")
    ax.plot([r.time_s for r in miss], [r.latency_ms for r in miss], "x", color="tab:red", ms=4,
            label=f"deadline miss ({len(miss)})")
    ax.step(t, [np.nan if k.latency_budget_ms is None else k.latency_budget_ms for k in ticks], where="post",
            color="black", label="latency budget")
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[3]
    names = sorted({k.active for k in ticks} | {k.proposed for k in ticks})
    position = {n: i for i, n in enumerate(names)}
    ax.step(t, [position[k.active] for k in ticks], where="post", label="active")
    ax.plot(t, [position[k.proposed] for k in ticks], ".", ms=3, label="proposed")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels([n[-16:] for n in names], fontsize=7)
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
