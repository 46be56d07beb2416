"""The profile document being built and the options that drive it, shared by :mod:`hmt.profile.run`
(the order of the steps) and :mod:`hmt.profile.stages` (the optional steps), which both import
this module and not each other at import time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hmt.profile.features import LayerFeature
from hmt.profile.fits import LinearFit, default_energy_coefficients, energy_design
from hmt.profile.predictor import HitRateCurve
from hmt.profile.schema import (
    PROFILE_SCHEMA_VERSION,
    SCHEMA_NAME,
    DeviceProfile,
    estimated,
    fitted,
    measured,
    quantity,
)

CROWDHMTWARE = "CrowdHMTware (shared/papers/crowdhmtware.md) III-D1, eq. 1: ratios d1:d2:d3(:dSM) = 1:6:200(:2)"
DEFAULT_CALIBRATION_VARIANTS = 12


@dataclass(frozen=True)
class ProfileOptions:
    device: str = "host"
    quick: bool = False
    supernet: Path | None = None
    batches: tuple[int, ...] = (1,)
    engine: str = "onnxruntime"
    processor: str = "cpu"
    # None: measured (ONNX Runtime on this CPU with a supernet: stages.measure_threads), else all cores.
    threads: int | None = None
    power: str | None = None
    power_options: Mapping[str, Any] = field(default_factory=dict)
    validate: int = 0
    # Variants measured end to end to fit the composition correction of the block-table
    # sum (``composition``); None: DEFAULT_CALIBRATION_VARIANTS when validating, else 0.
    calibrate_variants: int | None = None
    validate_load_processes: int = 1
    # Batch of the end-to-end validation; must be one of ``batches`` (the table rows it sums).
    validate_batch: int = 1
    load_model: bool = True
    rpc: str | None = None
    rpc_key: str | None = None
    rpc_target: str = "llvm"
    rpc_cc: str | None = None
    warmup: int | None = None
    repeats: int | None = None
    seed: int = 0
    # Calibration and validation variants are timed round-robin in this many rounds with a
    # reference variant between them (``interleave.py``); 0: one after the other (old scheme).
    interleave_rounds: int = 5
    # Fit the composition correction to reference-normalised times instead of raw medians.
    drift_normalise: bool = False

    @property
    def calibration_variants(self) -> int:
        if self.calibrate_variants is not None:
            return self.calibrate_variants
        return DEFAULT_CALIBRATION_VARIANTS if self.validate and self.supernet is not None else 0

    @property
    def timing(self) -> tuple[int, int]:
        warmup = self.warmup if self.warmup is not None else (3 if self.quick else 10)
        repeats = self.repeats if self.repeats is not None else (15 if self.quick else 50)
        return warmup, repeats


@dataclass
class ProfileRun:
    out_dir: Path
    profile: DeviceProfile
    summary: dict[str, Any]
    notes: list[str]
    validation: Any = None


class _Doc:
    """Builds the profile document, one provenance entry per step."""

    def __init__(self, name: str, dev_id: str, *, origin: str, engine: str, engine_version: str,
                 threads: int | None) -> None:
        self.when = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.where = dev_id
        self.profile = DeviceProfile({
            "schema": SCHEMA_NAME, "schema_version": PROFILE_SCHEMA_VERSION,
            "device": {"name": name, "id": dev_id, "origin": origin, "engine": engine,
                       "engine_version": engine_version, "threads": threads or 0},
            "provenance": {}, "notes": [],
        })
        self.doc = self.profile.doc

    def measured(self, pid: str, how: str, **extra: Any) -> str:
        self.doc["provenance"][pid] = measured(self.where, self.when, how, **extra)
        return pid

    def fitted(self, pid: str, how: str, inputs: list[str], **extra: Any) -> str:
        self.doc["provenance"][pid] = fitted(self.when, how, inputs, **extra)
        return pid

    def estimated(self, pid: str, citation: str, **extra: Any) -> str:
        self.doc["provenance"][pid] = estimated(citation, **extra)
        return pid

    def note(self, text: str) -> None:
        self.doc["notes"].append(text)


def _fit_entry(fit: LinearFit, pid: str, unit_of: Mapping[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "form": fit.form,
        "coefficients": {n: quantity(c, unit_of.get(n, "1"), pid) for n, c in fit.as_dict().items()},
        "n": quantity(fit.n, "count", pid),
    }
    # The error reported is the held-out one only (k-fold, or leave-one-out on few rows): an in-sample
    # R^2 or MAPE says how well the fit bends to the rows it saw, not how it predicts.
    if fit.cv_mape is not None:
        entry["cv_mape"] = quantity(fit.cv_mape, "fraction", pid)
    if fit.notes:
        entry["fit_notes"] = list(fit.notes)
    return entry


_LATENCY_UNITS = {"lambda1_ms_per_mac": "ms/MAC", "lambda1_ms_per_mac_byte": "ms*byte/MAC^2",
                  "lambda2_ms_per_byte": "ms/byte", "lambda3_ms_per_byte": "ms/byte",
                  "lambda0_ms_per_layer": "ms/layer"}


def energy_rows(probes: list[tuple[str, Any, tuple[int, ...], list[LayerFeature]]], curve: HitRateCurve,
                *, shared_memory: bool) -> tuple[np.ndarray, tuple[str, ...]]:
    samples = [p[3] for p in probes]
    return energy_design(samples, [[curve(f.bytes_moved) for f in s] for s in samples], shared_memory=shared_memory)


def default_energy_doc(d: _Doc, names: tuple[str, ...], *, shared_memory: bool) -> dict[str, Any]:
    pid = d.estimated("energy-default", CROWDHMTWARE + "; d1 = 1 MAC-equivalent (relative units) until calibrated")
    coef = default_energy_coefficients(shared_memory=shared_memory)
    return {"form": "eq1", "calibrated": False, "unit": "mac_equivalent",
            "coefficients": {n: quantity(c, "mac_equivalent per access", pid)
                             for n, c in zip(names, coef, strict=True)}}
