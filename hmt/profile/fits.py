"""Fitted latency and energy models (pure: features and measurements in, coefficients out).

Latency, CrowdHMTware eq. 2, per layer l with C = MACs, M = bytes moved (AdaScale eq. 4),
delta = C/M and eps = cache-hit rate::

    T = sum_l lambda1*delta_l*C_l + eps_l*lambda2*M_l + (1-eps_l)*lambda3*M_l

Two forms are fitted by non-negative least squares and both are reported:

- ``eq2``: the formula as printed;
- ``eq2+overhead``: lambda1*C_l instead of lambda1*delta_l*C_l plus a fixed cost per
  layer (lambda0). As printed, delta*C = C^2/M grows quadratically with layer size and
  nothing pays for the per-operator dispatch cost that dominates small layers on a CPU
  runtime; on our measurements this form fits clearly better (see the report of each fit).

Energy, CrowdHMTware eq. 1, ``E = sum d1*C + eps*d2*M + (1-eps)*d3*M (+ M*dSM on GPUs)``,
with the paper's ratios d1:d2:d3(:dSM) = 1:6:200(:2) per access until calibrated. An
access is one fp32 word, so the per-byte coefficients are ratio*d1/4. Uncalibrated, E is
in MAC-equivalents (relative: good for ranking, which is what the optimizer needs);
calibrated from a power source it is in millijoules.

The block-table model (AdaptiveNet 5.1) is a sum of table entries: see ``predictor``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hmt.profile.features import LayerFeature

Floats = Sequence[float] | np.ndarray
LATENCY_FORMS = ("eq2", "eq2+overhead")
DEFAULT_ENERGY_RATIOS = (1.0, 6.0, 200.0, 2.0)
WORD_BYTES = 4


# --------------------------------------------------------------------------- metrics


def r2_score(measured: Floats, predicted: Floats) -> float:
    y, p = np.asarray(measured, float), np.asarray(predicted, float)
    total = float(np.sum((y - y.mean()) ** 2))
    if total == 0.0:
        return 1.0 if np.allclose(y, p) else 0.0
    return 1.0 - float(np.sum((y - p) ** 2)) / total


def mape(measured: Floats, predicted: Floats) -> float:
    """Mean absolute percentage error, as a fraction (0.05 = 5%)."""
    y, p = np.asarray(measured, float), np.asarray(predicted, float)
    return float(np.mean(np.abs(p - y) / np.abs(y)))


def share_within(measured: Floats, predicted: Floats, tolerance: float) -> float:
    y, p = np.asarray(measured, float), np.asarray(predicted, float)
    return float(np.mean(np.abs(p - y) <= tolerance * np.abs(y)))


def kendall_tau(measured: Floats, predicted: Floats) -> float:
    from scipy.stats import kendalltau

    if len(measured) < 2:
        return float("nan")
    return float(kendalltau(measured, predicted).statistic)


# --------------------------------------------------------------------------- NNLS


@dataclass(frozen=True)
class LinearFit:
    """Non-negative coefficients of a linear model with its goodness of fit."""

    form: str
    names: tuple[str, ...]
    coefficients: tuple[float, ...]
    r2: float
    mape: float
    n: int
    cv_mape: float | None = None
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.coefficients, strict=True))

    def predict(self, design: np.ndarray) -> np.ndarray:
        return np.asarray(design, float) @ np.asarray(self.coefficients, float)


def nnls_fit(design: np.ndarray, target: np.ndarray, *, names: Sequence[str], form: str,
             relative: bool = True, folds: int = 5, seed: int = 0, robust: bool = False,
             labels: Sequence[str] | None = None) -> LinearFit:
    """NNLS of ``target ~ design @ coef`` (columns scaled for conditioning).

    With ``relative`` each row is divided by its target, so the fit minimises relative
    error: latencies span orders of magnitude and the small layers matter as much as the
    big ones. ``cv_mape`` is the cross-validated MAPE: k-fold from 2*folds rows, leave-one-out
    below that (None when leaving a row out leaves fewer rows than coefficients). It is the only
    error a profile reports for the fit: r2 and mape are in-sample, for tests and diagnostics.
    With ``robust`` one refit drops the rows far off the first fit (named in ``notes``);
    r2, mape, n and cv_mape then describe the rows kept.
    """
    from scipy.optimize import nnls

    X = np.asarray(design, float)
    y = np.asarray(target, float)
    if X.ndim != 2 or X.shape[0] != y.shape[0] or X.shape[1] != len(names):
        raise ValueError(f"design {X.shape} does not match target {y.shape} and {len(names)} names")
    if X.shape[0] < X.shape[1]:
        raise ValueError(f"{X.shape[0]} measurements cannot fit {X.shape[1]} coefficients")

    def solve(rows: np.ndarray) -> np.ndarray:
        Xs, ys = X[rows], y[rows]
        if relative:
            weights = 1.0 / np.maximum(np.abs(ys), 1e-12)
            Xs, ys = Xs * weights[:, None], ys * weights
        scale = np.max(np.abs(Xs), axis=0)
        scale[scale == 0] = 1.0
        coef, _ = nnls(Xs / scale, ys, maxiter=50 * X.shape[1])
        return np.asarray(coef / scale, dtype=float)

    rows = np.arange(X.shape[0])
    coef = solve(rows)
    notes: tuple[str, ...] = ()
    if robust:
        # One trimmed refit: a shared machine leaves a few measurements far off (another job
        # held the cores for the whole window); at most 20% of rows may go, each named.
        rel = np.abs(X @ coef - y) / np.abs(y)
        limit = max(0.5, 3.0 * 1.4826 * float(np.median(np.abs(rel - np.median(rel)))) + float(np.median(rel)))
        worst = np.argsort(-rel)[: max(0, X.shape[0] // 5)]
        drop = np.sort(worst[rel[worst] > limit])
        if drop.size and X.shape[0] - drop.size >= X.shape[1]:
            rows = np.setdiff1d(rows, drop)
            coef = solve(rows)
            notes = (f"trimmed {drop.size} outlier row(s) (relative error > {limit:.2f}): "
                     f"{', '.join(str(labels[i]) if labels else str(i) for i in drop)}",)
    pred = X[rows] @ coef
    cv = None
    k_folds = folds if rows.size >= 2 * folds else int(rows.size)  # leave-one-out below 2*folds rows
    if rows.size - int(np.ceil(rows.size / k_folds)) >= X.shape[1]:
        order = np.random.default_rng(seed).permutation(rows)
        errors = np.empty(X.shape[0])
        for k in range(k_folds):
            test = order[k::k_folds]
            train = np.setdiff1d(order, test)
            errors[test] = np.abs(X[test] @ solve(train) - y[test]) / np.abs(y[test])
        cv = float(errors[rows].mean())
    return LinearFit(form, tuple(names), tuple(float(c) for c in coef), r2_score(y[rows], pred),
                     mape(y[rows], pred), int(rows.size), cv, notes)


# --------------------------------------------------------------------------- latency (eq. 2)


def latency_design(samples: Sequence[Sequence[LayerFeature]], hit_rates: Sequence[Sequence[float]],
                   *, form: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """One row per sample (a layer or a block: a list of layers), summed over its layers.

    ``hit_rates[i][j]`` is eps of layer j of sample i. Units: C in MACs, M in bytes, so
    the coefficients come out in ms per MAC and ms per byte when the target is in ms.
    """
    if form not in LATENCY_FORMS:
        raise ValueError(f"unknown latency form {form!r}; known: {LATENCY_FORMS}")
    rows = []
    for layers, eps in zip(samples, hit_rates, strict=True):
        c = np.array([f.macs for f in layers], float)
        m = np.array([f.bytes_moved for f in layers], float)
        e = np.asarray(eps, float)
        hit, miss = float(np.sum(e * m)), float(np.sum((1 - e) * m))
        if form == "eq2":
            delta = np.divide(c, m, out=np.zeros_like(c), where=m > 0)
            rows.append([float(np.sum(delta * c)), hit, miss])
        else:
            rows.append([float(c.sum()), hit, miss, float(len(layers))])
    names = ("lambda1_ms_per_mac_byte", "lambda2_ms_per_byte", "lambda3_ms_per_byte") if form == "eq2" else (
        "lambda1_ms_per_mac", "lambda2_ms_per_byte", "lambda3_ms_per_byte", "lambda0_ms_per_layer")
    return np.asarray(rows, float).reshape(len(rows), len(names)), names


def fit_latency(samples: Sequence[Sequence[LayerFeature]], hit_rates: Sequence[Sequence[float]],
                latency_ms: Sequence[float], *, form: str, seed: int = 0, robust: bool = True,
                labels: Sequence[str] | None = None) -> LinearFit:
    design, names = latency_design(samples, hit_rates, form=form)
    return nnls_fit(design, np.asarray(latency_ms, float), names=names, form=form, seed=seed, robust=robust,
                    labels=labels)


# --------------------------------------------------------------------------- energy (eq. 1)


def energy_design(samples: Sequence[Sequence[LayerFeature]], hit_rates: Sequence[Sequence[float]],
                  *, shared_memory: bool = False) -> tuple[np.ndarray, tuple[str, ...]]:
    """Rows [sum C, sum eps*M/4, sum (1-eps)*M/4 (, sum M/4)]: MACs and fp32-word accesses."""
    rows = []
    for layers, eps in zip(samples, hit_rates, strict=True):
        c = np.array([f.macs for f in layers], float)
        words = np.array([f.bytes_moved for f in layers], float) / WORD_BYTES
        e = np.asarray(eps, float)
        row = [float(c.sum()), float(np.sum(e * words)), float(np.sum((1 - e) * words))]
        if shared_memory:
            row.append(float(words.sum()))
        rows.append(row)
    names = ["d1_per_mac", "d2_per_cache_access", "d3_per_dram_access"] + (["dsm_per_shared_access"]
                                                                             if shared_memory else [])
    return np.asarray(rows, float).reshape(len(rows), len(names)), tuple(names)


def default_energy_coefficients(*, d1: float = 1.0, shared_memory: bool = False) -> tuple[float, ...]:
    """The paper's 1:6:200(:2) ratios scaled by ``d1`` (1.0 = MAC-equivalents)."""
    ratios = DEFAULT_ENERGY_RATIOS if shared_memory else DEFAULT_ENERGY_RATIOS[:3]
    return tuple(d1 * r for r in ratios)


def calibrate_energy(design: np.ndarray, energy_mj: Floats, *, names: Sequence[str],
                     min_rows_per_coef: int = 3, max_condition: float = 1e6, cross_validate: bool = True) -> LinearFit:
    """Fit eq. 1 to measured energies (mJ per inference).

    All coefficients by NNLS when there are enough, well-conditioned rows; otherwise only
    the scale d1 with the default ratios kept (the paper: "their ratio can be measured
    offline"), so a short calibration never produces wild ratios. The fit says which.
    ``cv_mape`` is leave-one-out over the whole procedure (the choice of form included).
    """
    fit = _calibrate_energy(design, energy_mj, names=names, min_rows_per_coef=min_rows_per_coef,
                            max_condition=max_condition)
    X = np.asarray(design, float)
    y = np.asarray(energy_mj, float)
    if not cross_validate or X.shape[0] < 3:
        return replace(fit, cv_mape=None)
    held_out = np.empty(y.shape[0])
    for i in range(y.shape[0]):
        others = np.arange(y.shape[0]) != i
        held_out[i] = _calibrate_energy(X[others], y[others], names=names, min_rows_per_coef=min_rows_per_coef,
                                        max_condition=max_condition).predict(X[i:i + 1])[0]
    return replace(fit, cv_mape=mape(y, held_out))


def _calibrate_energy(design: np.ndarray, energy_mj: Floats, *, names: Sequence[str], min_rows_per_coef: int,
                      max_condition: float) -> LinearFit:
    X = np.asarray(design, float)
    y = np.asarray(energy_mj, float)
    ratios = np.asarray(DEFAULT_ENERGY_RATIOS[: X.shape[1]], float)
    # A term no calibration workload exercises (DRAM accesses where every layer fits the cache,
    # as on a GPU with a 60 MB L2) is a zero column: it says nothing about its coefficient and
    # makes the design singular. Fit the observed terms; an unobserved one keeps its default
    # ratio to d1, as the scale-only form keeps every ratio.
    observed = np.max(np.abs(X), axis=0) > 0
    if observed[0] and not observed.all():
        part = _calibrate_energy(X[:, observed], y, names=[n for n, o in zip(names, observed, strict=True) if o],
                                 min_rows_per_coef=min_rows_per_coef, max_condition=max_condition)
        if part.form == "eq1-nnls":
            fitted = iter(part.coefficients)
            d1 = part.coefficients[0]
            coef = tuple(float(next(fitted)) if o else float(d1 * r) for o, r in zip(observed, ratios, strict=True))
            pred = X @ np.asarray(coef)
            unseen = ", ".join(n for n, o in zip(names, observed, strict=True) if not o)
            return LinearFit("eq1-nnls", tuple(names), coef, r2_score(y, pred), mape(y, pred), int(X.shape[0]),
                             notes=(*part.notes, f"not exercised by any workload, kept at the default ratio to "
                                                 f"d1: {unseen}"))
    scaled = X / np.maximum(np.max(np.abs(X), axis=0), 1e-300)
    condition = float(np.linalg.cond(scaled)) if X.shape[0] >= X.shape[1] else float("inf")
    if X.shape[0] >= min_rows_per_coef * X.shape[1] and condition <= max_condition:
        full = nnls_fit(X, y, names=names, form="eq1-nnls")
        if all(c > 0 for c in full.coefficients):
            return full
    basis = X @ ratios
    weights = 1.0 / np.maximum(np.abs(y), 1e-12)
    d1 = float(np.sum(weights**2 * basis * y) / np.sum((weights * basis) ** 2))
    coef = tuple(float(d1 * r) for r in ratios)
    pred = X @ np.asarray(coef)
    note = (f"scale-only calibration (default ratios kept): {X.shape[0]} workloads, "
            f"condition number {condition:.3g}")
    return LinearFit("eq1-scaled", tuple(names), coef, r2_score(y, pred), mape(y, pred), int(X.shape[0]),
                     notes=(note,))


# --------------------------------------------------------------------------- load


@dataclass(frozen=True)
class LoadModel:
    """Latency under background load: ``T_load = T_idle * (1 + alpha * I)``, I in [0, 1]."""

    alpha: float
    r2: float
    n: int

    def factor(self, load_index: float) -> float:
        return 1.0 + self.alpha * float(np.clip(load_index, 0.0, 1.0))


def fit_load_model(labels: Sequence[str], load_index: Floats, latency_ms: Floats,
                   *, alpha_max: float = 8.0) -> LoadModel:
    """Fit ``T = T0_w * (1 + alpha * I)`` jointly over workloads w, in log space.

    Every workload is measured at two or more load indices (its "idle" run need not be at
    I = 0 on a shared machine); T0_w is profiled out in closed form for each alpha on a
    grid, and the alpha with the least squared log error wins.
    """
    names = np.asarray(labels)
    i = np.clip(np.asarray(load_index, float), 0.0, 1.0)
    log_t = np.log(np.asarray(latency_ms, float))
    groups = [names == name for name in np.unique(names)]
    best_alpha, best_sse = 0.0, np.inf
    for alpha in np.linspace(0.0, alpha_max, int(alpha_max * 200) + 1):
        resid = log_t - np.log1p(alpha * i)
        sse = sum(float(np.sum((resid[g] - resid[g].mean()) ** 2)) for g in groups)
        if sse < best_sse:
            best_alpha, best_sse = float(alpha), sse
    resid0 = log_t.copy()
    sst = sum(float(np.sum((resid0[g] - resid0[g].mean()) ** 2)) for g in groups)
    r2 = 1.0 - best_sse / sst if sst > 0 else 1.0
    return LoadModel(best_alpha, r2, int(i.size))


def load_index(cpu_util: float, *, gpu_util: float = 0.0, mem_util: float = 0.0,
               weights: tuple[float, float, float] = (1.0, 0.0, 0.0)) -> float:
    """AdaScale eq. 2 (serve's load index): I = (Wcpu*Ucpu + Wgpu*Ugpu + Wm*Um) / W, utilisations in [0, 1].

    The default weights count the CPU only: on a CPU engine GPU and memory use do not
    slow inference until memory runs out, which the memory budget handles separately.
    """
    w_cpu, w_gpu, w_mem = weights
    return (w_cpu * cpu_util + w_gpu * gpu_util + w_mem * mem_util) / (w_cpu + w_gpu + w_mem)
