"""What ``/v1/status`` shows of a controller: the active variant and where it runs, the load,
budgets and estimates the loop decides on, the pool, the request counts and the last decisions."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np


def controller_status(c: Any, last: int = 10) -> dict[str, Any]:
    """The status of ``c`` (a :class:`hmt.serve.controller.Controller`) with its ``last`` ticks; the
    counters and estimates are read together, under the controller's state lock."""
    with c.state_lock:
        ticks = list(c.ticks)
        stats = c.stats
        lat = np.array(stats.latency_ms) if stats.latency_ms else None
        dec = np.array(stats.decision_us) if stats.decision_us else None
        requests = stats.requests
        misses = stats.deadline_misses
        per_exit = {str(k): v for k, v in sorted(stats.per_exit.items())}
        per_variant = dict(stats.per_variant)
        shadow_runs, shadow_s = stats.shadow_runs, stats.shadow_s
        estimates = {e.arch_id: {"latency_ms": e.latency_ms, "source": e.source, "samples": e.samples,
                                 "ratio": e.ratio, "disagrees": e.disagrees}
                     for e in c.estimator.estimates(c.now_s(), c.load_scale)}
        disagreements = c.estimator.disagreements()
        engine_ratios = {e: c.estimator.engine_ratio(e) for e in sorted(set(c.estimator.engines))}
    latest = ticks[-1] if ticks else None
    decision = c.last_decision
    active = c.active_runner
    return {
        "ready": c.ready,
        "variant": c.active_arch_id,
        "engine": active.engine if active is not None else None,
        # What really runs: fuse's merged chain or graph by graph, and any provider fallback.
        "layout": active.layout if active is not None else None,
        "runtime_notes": list(active.notes) if active is not None else [],
        # The ORT providers this build can bind, of those asked for (serve --providers or the
        # bundle's target), and the request itself: a CPU-only machine lists only cpu.
        "providers": c.usable_providers,
        "providers_requested": list(c.providers),
        "fixed_variant": c.fixed_variant,
        "uptime_s": c.now_s(),
        "load_index": None if latest is None else latest.load_index,
        "load_forecast": None if latest is None else latest.load_forecast,
        "latency_ratio": None if latest is None else latest.latency_ratio,
        "overhead_ms": c.overhead_ms,
        "mu": None if latest is None else latest.mu,
        "budgets": {"latency_ms": c.budgets.latency_ms, "memory_mb": c.budgets.memory_mb},
        # serve.json memory_reserve_mb: the free-memory limit of the loaded variants (None: no reserve).
        "memory_free_limit_mb": c.free_memory.limit_mb,
        "energy_budget": c.budgets.energy,  # per inference, the profile's energy unit (None: unconstrained)
        "load_model": {"alpha_latency": c.optimizer.alpha_latency, "source": c.alpha_source},
        "own_cpu_util": None if latest is None else latest.own_cpu_util,
        # What the load index's CPU figure is read from (a cores' busy share, or a cgroup's CPU time
        # over its quota); None where the sampler reads no live CPU (a replay's own).
        "cpu_source": c.monitor.cpu_source,
        "estimates": estimates,
        "engine_ratios": engine_ratios,
        # Measured / predicted outside [r_min, r_max]: the measurement is what decides.
        "prediction_disagrees": disagreements,
        "feasible": None if decision is None else decision.feasible,
        "infeasible_reason": None if decision is None or decision.feasible else decision.reason,
        "shadow": {"runs": shadow_runs, "seconds": shadow_s, "not_kept_overlapped": c.shadow.overlapped,
                   "share_limit": c.settings.estimates.shadow_share},
        "early_exit": asdict(c.settings.early_exit),
        "pool": _pool_status(c),
        # Decisions answered from the cache (same feasible set, mu and active variant).
        "decision_cache": {"hits": c.decision.hits, "entries": c.decision.entries},
        "switches": c.switcher.switch_count,
        "requests": requests,
        "deadline_misses": misses,
        "per_exit": per_exit,
        "per_variant": per_variant,
        "latency_ms": None if lat is None else {"p50": float(np.percentile(lat, 50)),
                                                 "p95": float(np.percentile(lat, 95))},
        "decision_us_p50": None if dec is None else float(np.median(dec)),
        "last_error": c.last_error,
        # The decision thread: alive, and the errors it outlived that are bugs rather than HmtErrors.
        "control_loop": _control_loop_status(c),
        "adapt": None if c.adapt is None else c.adapt.status(),
        # serve --blocks / --research (hmt.serve.running.blocks, hmt.serve.deciding.research)
        "blocks": c.pool.status() if hasattr(c.pool, "status") else None,
        "research": None if getattr(c, "research", None) is None else
        c.research.status(lambda t: t - c.t0_s),
        "last_decisions": [t.to_json_dict() for t in ticks[-last:]],
    }


def _pool_status(c: Any) -> dict[str, Any]:
    """What the variant pool holds and has done (loads, failures, evictions)."""
    capacity = c.capacity_bytes()
    pool = c.pool
    return {"loaded": pool.loaded_ids(), "loaded_mb": pool.loaded_bytes() / 1e6,
            "capacity_mb": None if capacity is None else capacity / 1e6,
            "loads": pool.load_count, "load_failures": pool.load_failures,
            "evictions": pool.evictions, "integrity_failures": pool.integrity_failures}


def _control_loop_status(c: Any) -> dict[str, Any]:
    loop = c.loop
    return {"alive": loop.alive, "seconds_since_decision": loop.seconds_since_tick(), "period_s": loop.period_s,
            "unexpected_errors": loop.unexpected_errors, "last_unexpected_error": loop.last_unexpected_error}
