"""The optimizer's table and load model of a bundle, and the latency estimator over that table."""

from __future__ import annotations

import math
from dataclasses import replace

from hmt.bundle import Bundle
from hmt.errors import HmtError
from hmt.runtime.settings import ServeSettings
from hmt.serve.deciding.costs import Variant
from hmt.serve.deciding.estimates import LatencyEstimator
from hmt.serve.deciding.optimizer import DEFAULT_ALPHA, Optimizer, OptimizerConfig


def variants_of(bundle: Bundle) -> list[Variant]:
    """The optimizer's table: each bundled variant at its own exit."""
    return [Variant(v.arch_id, v.accuracy, v.latency_ms, v.energy, int(v.memory_mb * 1e6))
            for v in bundle.spec.variants]


def profile_alpha(bundle: Bundle) -> float | None:
    """The load model's alpha that profile-device fitted (``models.load.alpha``), if the profile has one."""
    try:
        value = bundle.profile()["models"]["load"]["alpha"]
        alpha = float(value["value"] if isinstance(value, dict) else value)
    except (HmtError, KeyError, TypeError, ValueError):
        return None
    return alpha if math.isfinite(alpha) and alpha >= 0 else None


def optimizer_config(bundle: Bundle, settings: ServeSettings) -> tuple[OptimizerConfig, str]:
    """serve.json's optimizer settings with the load model resolved: serve.json's alpha when it
    sets one, else the one profile-device fitted, else the default (and where it came from)."""
    config = settings.optimizer
    if config.alpha_latency is not None:
        return config, "serve.json"
    alpha = profile_alpha(bundle)
    if alpha is None:
        return (replace(config, alpha_latency=DEFAULT_ALPHA),
                f"default {DEFAULT_ALPHA:g} (the profile has no load model)")
    energy = alpha if config.alpha_energy is None else config.alpha_energy
    return replace(config, alpha_latency=alpha, alpha_energy=energy), "profile models.load.alpha"


def estimator_for(bundle: Bundle, optimizer: Optimizer, settings: ServeSettings) -> LatencyEstimator:
    """The latency estimator of ``optimizer``'s table: each variant's prediction as its prior, on the
    bundle's preferred engine until it runs, with serve.json's estimate and correction settings."""
    table = optimizer.variants
    c = settings.correction
    engines = [bundle.spec.variant(v.arch_id).preferred_engine for v in table]
    return LatencyEstimator([v.arch_id for v in table], [v.latency_ms for v in table], engines, settings.estimates,
                            smoothing=c.smoothing, r_min=c.r_min, r_max=c.r_max,
                            alpha_latency=optimizer.alpha_latency)
