"""Joining what re-search found to the serving loop (:mod:`hmt.serve.deciding.research`): the found
variant enters the optimizer's table, the estimator and the pool (:func:`adopt`), and
:func:`attach` wires a search to a controller (offered every decision, yielding to its requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hmt.runtime.blocks import BlockStore, ComposedRunner
from hmt.serve.deciding.research import Measured, Research, ResearchSettings


def _remap_estimator(old: Any, new: Any, order: Sequence[int]) -> Any:
    """Carry ``old``'s state into ``new`` (built for the extended table): every per-variant list
    moves to the variant's new place (``order[i]``: old index i's new index); the added variant
    keeps ``new``'s fresh entry; the (variant, level) sets are renumbered; the rest is copied."""
    n = len(old.arch_ids)
    fresh_keys = {"arch_ids", "predicted_ms", "engines", "_index", "_latency_key", "_latency_value"}
    for name, value in vars(old).items():
        if name in fresh_keys:
            continue
        current = getattr(new, name, None)
        if isinstance(value, list) and isinstance(current, list) and len(value) == n and len(current) == n + 1:
            merged = list(current)
            for i, item in enumerate(value):
                merged[order[i]] = item
            setattr(new, name, merged)
        elif isinstance(value, set) and all(isinstance(k, tuple) and len(k) == 2 for k in value):
            setattr(new, name, {(order[i], level) for i, level in value})
        else:
            setattr(new, name, value)
    new.version = old.version + 1
    new._latency_key = None
    return new


def table_accuracy(controller: Any, measured: Measured) -> float:
    """``measured``'s accuracy on the optimizer table's scale: the bundled variants' table accuracies
    come from pareto (their own BN statistics, its data), the found one's from the calibration set.
    When the search's start variant is in the table and blocks.json has its calibration accuracy,
    the found variant gets the start's table accuracy plus the difference the calibration set
    measured between them; otherwise its calibration accuracy as it is."""
    accuracy = measured.accuracy if measured.accuracy is not None else 0.0
    research = controller.research
    if research is None or not research.outcomes:
        return accuracy
    start = research.outcomes[-1].start_arch_id
    start_calibration = research.space.accuracy.get(start)
    table = {v.arch_id: v.accuracy for v in controller.optimizer.variants}
    if start_calibration is None or start not in table:
        return accuracy
    return table[start] + accuracy - start_calibration


def adopt(controller: Any, measured: Measured, runner: ComposedRunner) -> None:
    """Add what re-search found to ``controller``'s pool and optimizer table, keeping every other
    variant's estimates: its prior is its measured median (so the engine's r and the load scale,
    which multiply a prior, give it back at the load it was measured under) until its own requests
    measure it (the search's few timed runs are not filed as samples: on a busy CPU one preempted
    run sets a window's p95, and the fallback, the fastest by estimate, then kept the slower pool
    variant); its accuracy is :func:`table_accuracy`. Energy: the active variant's,
    scaled by the latency ratio (profiles give energy as power x time; nothing measured it for
    this variant)."""
    from hmt.serve.deciding.costs import Variant
    from hmt.serve.deciding.decision import DecisionPath
    from hmt.serve.deciding.estimates import LatencyEstimator
    from hmt.serve.deciding.optimizer import Optimizer

    if not runner.warm:  # per-graph times for early exit and r, as the pool's loads do
        runner.warm_up(controller.pool._warm_input, controller.pool.warmup_runs)
    with controller._tick_lock:
        old_opt, old_est = controller.optimizer, controller.estimator
        if measured.arch_id in {v.arch_id for v in old_opt.variants}:
            runner.close()  # a bundled variant the search timed: the table has it; its blocks go back
            return
        active = controller.active_arch_id
        ref = old_opt.variant(active) if active in {v.arch_id for v in old_opt.variants} else old_opt.variants[0]
        scale = 1.0 + old_opt.alpha_latency * controller.load.now
        r = old_est.engine_ratio(runner.engine) or 1.0
        prior_ms = measured.latency_ms / (scale * r)
        energy = ref.energy_mj * prior_ms / ref.latency_ms
        accuracy = table_accuracy(controller, measured)
        variant = Variant(measured.arch_id, accuracy, prior_ms, energy, measured.memory_bytes)
        optimizer = Optimizer([*old_opt.variants, variant], old_opt.config)
        ids = [v.arch_id for v in optimizer.variants]
        engines = {a: e for a, e in zip(old_est.arch_ids, old_est.engines)}
        engines[measured.arch_id] = runner.engine
        priors = {a: p for a, p in zip(old_est.arch_ids, old_est.predicted_ms)}
        priors[measured.arch_id] = prior_ms
        new = LatencyEstimator(ids, [priors[a] for a in ids], [engines[a] for a in ids], old_est.settings,
                               smoothing=old_est.smoothing, r_min=old_est.r_min, r_max=old_est.r_max,
                               alpha_latency=old_est.alpha_latency)
        position = {a: i for i, a in enumerate(ids)}
        estimator = _remap_estimator(old_est, new, [position[a] for a in old_est.arch_ids])
        runner.variant = replace(runner.variant, latency_ms=prior_ms, accuracy=accuracy)
        decision = DecisionPath(optimizer, controller.fixed_variant, controller.settings.switch.score_margin)
        with controller.state_lock:
            controller.optimizer, controller.estimator, controller.decision = optimizer, estimator, decision
            controller._known_ids = frozenset(ids)
            controller.shadow.estimator = estimator
            controller.shadow.optimizer = optimizer  # its neighbours: positions in the extended table
            controller.shadow._known_ids = controller._known_ids
        controller.pool.add(measured.arch_id, runner)
    controller.request_tick()


def attach(controller: Any, settings: ResearchSettings | None = None) -> Research:
    """Re-search for ``controller`` (its bundle ships blocks and a calibration set): the loop offers
    it every decision, what it finds is :func:`adopt`-ed. Uses the pool's block store under serve
    --blocks (candidates share its loaded blocks), else a store of its own."""
    from hmt.runtime.blocks import load_block_space, load_calibration

    pool = controller.pool
    store = getattr(pool, "store", None)
    if store is None:
        space = load_block_space(controller.bundle)
        store = BlockStore(controller.bundle, space, providers=controller.providers)
    calibration = load_calibration(controller.bundle, store.space)
    early = controller.settings.early_exit
    shadow = controller.shadow
    research = Research(store.space, store, calibration, settings, clock=controller._clock,
                        on_found=lambda measured, runner: adopt(controller, measured, runner),
                        confidence=early.confidence if early.enabled else None,
                        requests=lambda: (shadow.inflight, shadow.started), served=pool.get)
    controller.research = research
    return research
