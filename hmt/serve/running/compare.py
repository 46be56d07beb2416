"""Replay one scenario adaptively and once per bundled variant, and score it against the oracle.

``hmt serve --scenario ... --compare`` and the oracle benchmark (``benchmarks/serve/oracle.py``)
call :func:`replay_compare`: the static runs first (each variant served alone, as ``serve
--variant`` does), then the adaptive one, on the same scenario, inputs, clients and load;
:mod:`hmt.serve.reporting.oracle` turns the records into the per-phase comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hmt.bundle import Bundle, load_bundle
from hmt.serve.deciding.optimizer import Optimizer
from hmt.serve.deciding.table import optimizer_config, variants_of
from hmt.serve.http.api import ApiOptions
from hmt.serve.http.server import ServerOptions
from hmt.serve.reporting.oracle import compare, phase_bounds, phase_memory_budgets, phase_mu, phase_scores
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import ScenarioResult, SessionOptions, run_scenario, settings_for

ADAPTIVE = "adaptive"


@dataclass
class Comparison:
    """The runs of one comparison and its per-phase rows (:func:`hmt.serve.reporting.oracle.compare`)."""

    largest: str  # the most accurate variant (the static baseline a user would pick)
    accuracy: dict[str, float]  # each variant's table accuracy
    runs: dict[str, ScenarioResult]  # "adaptive" and one per variant
    phases: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Whole-scenario figures of the adaptive run, the static largest and the oracle's runs."""
        def whole(key: str, name: str) -> float | None:
            rows = [p[key] for p in self.phases]
            judged = sum(r["judged"] for r in rows)
            if name == "miss_share":
                return sum(r["misses"] for r in rows) / judged if judged else None
            # weighed by the answers (the requests a phase's accuracy is over), not by the requests
            # judged for a deadline: a scenario without a latency budget judges none
            weighted = [(r[name], sum(r["variants"].values())) for r in rows if r[name] is not None]
            total = sum(w for _, w in weighted)
            return sum(v * w for v, w in weighted) / total if total else None

        out: dict[str, Any] = {}
        for key in ("adaptive", "oracle", "static_largest"):
            out[key] = {name: whole(key, name) for name in ("miss_share", "accuracy", "table_accuracy")}
        adaptive = self.runs[ADAPTIVE].summary
        out["adaptive"].update(switches=adaptive["switches"], decision_us=adaptive["decision_us"],
                               first_clean_window_s_max=adaptive["first_clean_window_s_max"])
        # A phase the adaptive run sent nothing in (shorter than the gap between requests) shows
        # nothing about the loop: the counts are over the phases with requests.
        sent = [p for p in self.phases if p["sent"]]
        out["phases_tracked"] = sum(bool(p["tracks_oracle"]) for p in sent)
        out["phases_budgets_met"] = {key: sum(bool(p["budgets_met"][key]) for p in sent)
                                     for key in ("adaptive", "oracle", "static_largest")}
        out["phases"] = len(sent)
        out["phases_without_requests"] = len(self.phases) - len(sent)
        return out


def replay_compare(bundle_path: Path | str, scenario: Scenario, options: SessionOptions, drive: DriveOptions, *,
                   api: ApiOptions | None, server: ServerOptions | None, data: Path | None = None,
                   seed: int = 0, variants: Sequence[str] | None = None, warmup_s: float = 0.0,
                   timeline_dir: Path | None = None,
                   on_run: Callable[[str, ScenarioResult], None] | None = None,
                   trace: Callable[[Any, Any], None] | None = None) -> Comparison:
    """Replay ``scenario`` once per variant (``variants``: these only; default all) and adaptively.

    ``on_run`` is called after each run with its name; ``trace`` goes to the adaptive run
    (:func:`~hmt.serve.running.session.run_scenario`), and so does ``timeline_dir``. ``warmup_s``: see
    :func:`~hmt.serve.reporting.oracle.phase_scores`."""
    bundle = load_bundle(bundle_path)
    table = {v.arch_id: v for v in bundle.spec.variants}
    names = list(variants) if variants is not None else list(table)
    accuracy = {a: float(table[a].accuracy) for a in names}
    largest = max(names, key=lambda a: (accuracy[a], -table[a].latency_ms))
    runs: dict[str, ScenarioResult] = {}
    # The runs follow one another; on a machine whose other load drifts (a shared one), runs next to
    # each other share its state. The order turns with the seed, so repetitions with different seeds
    # do not always put the adaptive run beside the same static one.
    order = [*names, ADAPTIVE]
    turn = seed % len(order)
    for name in order[turn:] + order[:turn]:
        fixed = None if name == ADAPTIVE else name
        result = run_scenario(bundle_path, scenario, dataclasses.replace(options, fixed_variant=fixed), drive,
                              api=api, server=server, data=data, rng=np.random.default_rng(seed),
                              label=name, trace=trace if fixed is None else None,
                              timeline_dir=timeline_dir if fixed is None else None)
        runs[name] = result
        if on_run is not None:
            on_run(name, result)
    bounds = phase_bounds(scenario.step_times, drive.duration_s)
    scores = {name: phase_scores(r.records, bounds, {a: float(v.accuracy) for a, v in table.items()},
                                       warmup_s) for name, r in runs.items()}
    comparison = Comparison(largest=largest, accuracy=accuracy, runs=runs)
    # The oracle competes within the memory budget the adaptive loop had in each phase.
    memory = phase_memory_budgets(runs[ADAPTIVE].ticks, bounds)
    mu = phase_mu(runs[ADAPTIVE].ticks, bounds)
    comparison.phases = compare(scores[ADAPTIVE], {a: scores[a] for a in names}, accuracy, largest=largest,
                                memory_mb={a: float(table[a].memory_mb) for a in names}, phase_memory_mb=memory,
                                ranking=_objective(bundle, options, names, mu), mu=mu)
    return comparison


def _objective(bundle: Bundle, options: SessionOptions, names: Sequence[str],
               mu: Sequence[float | None]) -> list[dict[str, float] | None]:
    """Per phase, eq. 3's score of each variant at the phase's ``mu`` where it is below 1 (a battery
    below full weighs energy in the loop's choice); None where the loop weighed accuracy alone."""
    settings, _ = settings_for(bundle, options)
    config, _ = optimizer_config(bundle, settings)
    optimizer = Optimizer(variants_of(bundle), config)
    ids = [v.arch_id for v in optimizer.variants]
    out: list[dict[str, float] | None] = []
    for m in mu:
        if m is None or m >= 1.0:
            out.append(None)
            continue
        by_id = dict(zip(ids, optimizer.scores(m)))
        out.append({a: by_id[a] for a in names})
    return out
