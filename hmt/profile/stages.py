"""The steps of ``profile_device`` after the micro-benchmarks (see ``run.py`` for the order)."""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hmt.errors import ModelError
from hmt.profile.blocktable import BLOCK_UNITS, measure_block_table
from hmt.profile.calibrate import Workload, calibrate
from hmt.profile.devices import DEVICES, shipped_profile
from hmt.profile.document import (
    _LATENCY_UNITS,
    ProfileOptions,
    ProfileRun,
    _Doc,
    _fit_entry,
    default_energy_doc,
    energy_rows,
)
from hmt.profile.fits import LATENCY_FORMS, fit_latency
from hmt.profile.load import measure_load_model
from hmt.profile.power.base import PowerSource
from hmt.profile.predictor import HitRateCurve, Predictor
from hmt.profile.schema import DeviceProfile, quantity, write_profile_artifact
from hmt.profile.timing import ROW_UNITS, OrtRunner, TorchRunner, time_callable
from hmt.progress import ProgressCallback


def open_supernet(path: Path) -> Any:
    """Load and verify a supernet artifact (hmt.supernet.load_supernet)."""
    try:
        from hmt.supernet import load_supernet
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"this hmt has no supernet loader (hmt.supernet.load_supernet: {exc})") from exc
    return load_supernet(path)


def make_runner(options: ProfileOptions) -> Any:
    if options.rpc is not None or options.engine == "tvm":
        from hmt.profile.rpc import TvmRunner

        return TvmRunner(tracker=options.rpc, key=options.rpc_key, target=options.rpc_target, cc=options.rpc_cc)
    if options.engine == "torch":
        return TorchRunner(device=options.processor, threads=options.threads)
    return OrtRunner(threads=options.threads, device=options.processor)


# A thread count is chosen over a smaller one only when it is this much faster (more threads cost the
# device's other work CPU, and a thread pool adds per-call costs that a block table timed alone pays).
THREADS_GAIN = 0.05


def thread_candidates(cores: int) -> list[int]:
    """1, 2, 4, ... up to the cores this process may run on, and that count itself."""
    counts = {1, cores}
    n = 2
    while n < cores:
        counts.add(n)
        n *= 2
    return sorted(counts)


def choose_threads(timings_ms: dict[int, float]) -> int:
    """The fewest threads within ``THREADS_GAIN`` of the fastest count."""
    best = min(timings_ms.values())
    return min(t for t, ms in timings_ms.items() if ms <= best * (1 + THREADS_GAIN))


def measure_threads(options: ProfileOptions, loaded: Any, progress: ProgressCallback,
                    rounds: int = 3) -> tuple[int, dict[int, float]]:
    """ONNX Runtime's thread count for this device, measured: the supernet's largest variant run end to
    end (batch 1) at each candidate count (:func:`thread_candidates` of the CPUs this process may use:
    a device class's pinned cores), ``rounds`` rounds in turn, the median per count; the fewest threads
    within ``THREADS_GAIN`` of the fastest (:func:`choose_threads`). On a CPU budget shared by its
    cores, one thread can be the fastest; on a board whose cores each run freely, more."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    module = loaded.net.materialize(loaded.space.largest()).eval()
    shape = (1, *tuple(module.input_shape))
    warmup, repeats = options.timing
    candidates = thread_candidates(cores)
    samples: dict[int, list[float]] = {t: [] for t in candidates}
    runs = {t: OrtRunner(threads=t).prepare(module, shape) for t in candidates}
    total = rounds * len(candidates)
    for done, t in enumerate(candidates * rounds, start=1):  # the counts in turn, round after round
        samples[t].append(time_callable(runs[t], warmup=warmup, repeats=repeats).sustained_or_median_ms)
        progress("engine threads", done, total, f"{t} thread(s)")
    timings = {t: float(np.median(v)) for t, v in samples.items()}
    return choose_threads(timings), timings


def remote_curve(d: _Doc, name: str, options: ProfileOptions) -> HitRateCurve:
    """A remote device gets the cache-hit curve of its shipped estimated profile."""
    d.doc["facts"] = {"rpc_tracker": options.rpc, "rpc_key": options.rpc_key, "tvm_target": options.rpc_target}
    d.note("remote device: micro-benchmarks run only on the machine hmt runs on; facts and the cache-hit "
           "curve are taken from the shipped estimated profile where there is one")
    if DEVICES[name].shipped:
        shipped = shipped_profile(name)
        table = shipped.table("cache_hit_rate")
        meta = shipped.doc["tables"]["cache_hit_rate"]
        pid = d.estimated("hit-rate-shipped", shipped.doc["provenance"][meta["source"]].get(
            "citation", f"profiles/{DEVICES[name].shipped}"))
        d.profile.add_table("cache_hit_rate", table, units=meta["units"], source=pid)
        return HitRateCurve(tuple(int(s) for s in table.size_bytes), tuple(float(r) for r in table.hit_rate))
    import pandas as pd

    sizes, rates = [64 * 1024, 512 * 1024, 1024 * 1024, 64 * 1024 * 1024], [1.0, 1.0, 0.0, 0.0]
    pid = d.estimated("hit-rate-assumed", "assumption: a 512 KiB-1 MiB last-level cache, typical of Cortex-A "
                                          "boards (Arm Cortex-A53/A72 TRMs: L2 of 128 KiB-2 MiB)")
    d.profile.add_table("cache_hit_rate", pd.DataFrame({"size_bytes": sizes, "hit_rate": rates}),
                        units={"size_bytes": "byte", "hit_rate": "fraction"}, source=pid)
    return HitRateCurve(tuple(sizes), tuple(rates))


MIN_LOAD_SPREAD = 0.15


def load_section(d: _Doc, options: ProfileOptions, runner: Any, probes: list[Any], loaded: Any,
                 progress: ProgressCallback) -> None:
    """Time representative workloads with and without busy processes; fit alpha.

    Representative: with a supernet, its smallest, largest and one random variant (what
    serve will run); else small, median and upper-quartile probes (the largest probe is
    far bigger than any block and its multi-threaded slowdown misleads). When the load
    index barely moves (the machine is already busy), alpha is not identifiable: it is
    set to 0 (what was observed: no measurable slowdown) and the profile says so.
    """
    import os

    import pandas as pd

    warmup, repeats = options.timing
    if loaded is not None:
        rng = np.random.default_rng(options.seed + 1)
        archs = [loaded.space.smallest(), loaded.space.sample(rng), loaded.space.largest()]
        workloads = []
        for arch in archs:
            model = loaded.net.materialize(arch)
            workloads.append((arch.arch_id, model, (1, *model.input_shape)))
        what = "3 supernet variants (smallest, random, largest)"
    else:
        ranked = sorted(probes, key=lambda p: sum(f.macs for f in p[3]))
        chosen = [ranked[len(ranked) // 10], ranked[len(ranked) // 2], ranked[(3 * len(ranked)) // 4]]
        workloads = [(name, module, shape) for name, module, shape, _ in chosen]
        what = "3 probe layers (10th, 50th, 75th percentile of MACs)"
    timers = [(name, partial(runner.time, module, shape, warmup=warmup, repeats=repeats))
              for name, module, shape in workloads]
    cores = os.cpu_count() or 1
    processes = (1,) if options.quick or cores == 1 else (1, cores)
    progress("load model", 0, 1, f"{processes} busy processes")
    model, samples = measure_load_model(timers, processes=processes)
    progress("load model", 1, 1, None)
    pid = d.measured("load", f"{what} timed as found and beside {processes} processes each burning a core; load "
                             "index I = background CPU utilisation (AdaScale eq. 2 with CPU weight only)")
    d.profile.add_table("load_samples", pd.DataFrame([dataclasses.asdict(s) for s in samples]),
                        units={"label": "name", "processes": "count", "latency_ms": "ms", "load_index": "fraction"},
                        source=pid)
    indices = [s.load_index for s in samples]
    spread_i = max(indices) - min(indices)
    identifiable = spread_i >= MIN_LOAD_SPREAD
    alpha = model.alpha if identifiable else 0.0
    fid = d.fitted("fit-load", "T = T0_w * (1 + alpha*I) jointly over the workloads, least squares in log T",
                   ["load"])
    d.doc.setdefault("models", {})["load"] = {
        "form": "T_load = T_idle * (1 + alpha * I)", "identifiable": identifiable,
        "alpha": quantity(alpha, "1", fid), "r2": quantity(model.r2, "1", fid), "n": quantity(model.n, "count", fid),
        "load_index_spread": quantity(spread_i, "fraction", pid),
    }
    if not identifiable:
        d.note(f"load model: the load index moved only {spread_i:.2f} between runs (the machine was already busy), "
               f"so alpha cannot be fitted (the fit gave {model.alpha:.2f}); alpha = 0, i.e. the slowdown observed")


def energy_section(d: _Doc, options: ProfileOptions, runner: Any, probes: list[Any], curve: HitRateCurve,
                   power_source: PowerSource | None, progress: ProgressCallback) -> None:
    import pandas as pd

    shared = options.processor == "cuda"
    design, names = energy_rows(probes, curve, shared_memory=shared)
    models = d.doc.setdefault("models", {})
    if power_source is None:
        models["energy"] = default_energy_doc(d, names, shared_memory=shared)
        d.note("energy model uncalibrated: eq. 1 with the paper's default ratios, in MAC-equivalents")
        return
    source = power_source
    workloads = [Workload(name, runner.prepare(module, shape, seed=options.seed), tuple(float(v) for v in row))
                 for (name, module, shape, _), row in zip(probes, design, strict=True)]
    result = calibrate(source, workloads, names=names, window_s=0.4 if options.quick else 1.5,
                       idle_s=0.5 if options.quick else 2.0, progress=progress)
    pid = d.measured("power", f"{source.describe()}: idle baseline, sync pattern, then each probe back to back "
                              "for a window; dynamic energy = window energy - idle power * duration",
                     trace_span_s=list(result.trace_span_s))
    fid = d.fitted("fit-energy", "CrowdHMTware eq. 1 fitted to the dynamic energy per inference", ["power", "probes",
                                                                                                     "cold-warm"])
    entry = _fit_entry(result.fit, fid, {n: "mJ per access" for n in names})
    entry.update({"calibrated": True, "unit": "mJ", "idle_w": quantity(result.idle_w, "W", pid)})
    entry["coefficients"] = {n: quantity(c, "mJ per MAC" if n.endswith("mac") else "mJ per access", fid)
                             for n, c in result.fit.as_dict().items()}
    models["energy"] = entry
    work = [w for w in result.windows]
    energies = iter(result.energy_mj)
    d.profile.add_table("energy_timeline", pd.DataFrame([{
        "label": w.label, "t_start": w.t_start, "t_end": w.t_end, "runs": w.runs,
        "energy_mj": (next(energies) if w.is_workload
                      else float("nan"))} for w in work]),
        units={"label": "name", "t_start": "unix s", "t_end": "unix s", "runs": "count",
               "energy_mj": "mJ per inference"}, source=pid)


def block_table_section(d: _Doc, options: ProfileOptions, runner: Any, loaded: Any, curve: HitRateCurve,
                        progress: ProgressCallback, *, out_dir: Path) -> None:
    from hmt.artifacts.paths import relative_to_artifact

    warmup, repeats = options.timing
    frame, layers = measure_block_table(loaded.net.iter_block_choices(), runner, batches=options.batches,
                                        warmup=warmup, repeats=repeats, progress=progress)
    pid = d.measured("block-table", f"every (position, choice) of the supernet timed alone on {runner.engine} "
                                    f"({warmup} warm-up, >= {repeats} runs and >= 0.2 s back to back); latency_ms = "
                                    "median per call; sustained_ms = median over >= 20 ms bursts of the mean per "
                                    "call, less the time it waited runnable for a CPU; overhead_ms = a pass-through "
                                    "model's sustained time at the block's input; net_ms = sustained - overhead")
    d.profile.add_table("block_latency", frame, units={**BLOCK_UNITS, **ROW_UNITS}, source=pid)
    # Relative to the profile artifact, as its config records it: no path of this machine.
    d.doc["supernet"] = {"path": relative_to_artifact(loaded.artifact.root, out_dir),
                         "manifest_sha256": loaded.artifact.manifest_sha256,
                         "space_tag": getattr(loaded.space, "tag", None)}
    batch1 = frame[frame.batch == 1]
    samples = [layers[(r.position, r.choice, 1)] for r in batch1.itertuples(index=False)]
    keep = [i for i, s in enumerate(samples) if s]
    if len(keep) >= 8:
        eps = [[curve(f.bytes_moved) for f in samples[i]] for i in keep]
        fits = {}
        for form in LATENCY_FORMS:
            labels = [f"{r.position}/{r.choice}" for r in batch1.itertuples(index=False)]
            fit = fit_latency([samples[i] for i in keep], eps, batch1.latency_ms.to_numpy()[keep].tolist(), form=form,
                              seed=options.seed, labels=[labels[i] for i in keep])
            fid = d.fitted(f"fit-latency-blocks-{form}", f"CrowdHMTware eq. 2 ({form}) by NNLS on the block table",
                           ["block-table", "cold-warm"])
            fits[form] = _fit_entry(fit, fid, _LATENCY_UNITS)
        d.doc.setdefault("models", {})["latency_fits_blocks"] = fits


def calibration_rng(seed: int) -> np.random.Generator:
    """The calibration variants' generator: a stream of its own, apart from validation's
    (``default_rng(seed)``) and the load model's (``default_rng(seed + 1)``)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xC0,)))


def reference_rng(seed: int) -> np.random.Generator:
    """The drift reference variant's generator (a stream of its own, like calibration's)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xD1,)))


def schedule_rng(seed: int) -> np.random.Generator:
    """The per-round orders of interleaved timing."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5C,)))


def drift_reference(options: ProfileOptions, runner: Any, loaded: Any) -> Any:
    """The Drift (validate.py) shared by calibration and validation: a random variant of its
    own seed stream, prepared once and resident for the run; None when timing one variant
    after the other (--interleave-rounds 0, or a runner that cannot interleave: TVM)."""
    from hmt.profile.interleave import InterleaveSettings
    from hmt.profile.validate import Drift

    if not options.interleave_rounds or not getattr(runner, "interleaves", True):
        return None
    arch = loaded.space.sample(reference_rng(options.seed))
    model = loaded.net.materialize(arch)
    run = runner.prepare(model, (options.validate_batch, *tuple(model.input_shape)), seed=options.seed)
    return Drift(run, str(arch.arch_id), schedule_rng(options.seed),
                 InterleaveSettings(rounds=options.interleave_rounds))


def _timing_how(drift: Any) -> str:
    if drift is None:
        return "each variant timed alone in turn"
    st = drift.settings
    return (f"interleaved: groups of <= {st.group_size} variants resident at once, {st.rounds} rounds in a seeded "
            f"shuffled order per round, reference variant {drift.reference_id} timed at the start and end of every "
            f"round and after every {st.ref_every} variants; measured_ms = median of all timed runs (raw), "
            "normalised_ms = per-visit medians scaled by the reference around the visit")


def composition_section(d: _Doc, options: ProfileOptions, runner: Any, loaded: Any,
                        progress: ProgressCallback, drift: Any = None) -> None:
    """Measure the calibration variants and store the composition correction they fit."""
    from hmt.profile.composition import COMPOSITION_UNITS
    from hmt.profile.validate import CALIBRATION_UNITS, calibrate_composition

    warmup, repeats = options.timing
    n = options.calibration_variants
    normalised = options.drift_normalise and drift is not None
    result = calibrate_composition(loaded.net, loaded.space, Predictor(d.profile), runner, n=n,
                                   rng=calibration_rng(options.seed), batch=options.validate_batch, warmup=warmup,
                                   repeats=repeats, seed=options.seed, progress=progress, drift=drift,
                                   fit_normalised=normalised)
    pid = d.measured("composition-calibration", f"{len(result.table)} random variants (seed {options.seed}, "
                                                f"calibration stream; batch {options.validate_batch}) materialised "
                                                "and timed end to end, idle; never reused by validation; "
                                                + _timing_how(drift))
    d.profile.add_table("composition_calibration", result.table, units=CALIBRATION_UNITS, source=pid)
    target = "reference-normalised" if normalised else "measured (raw median)"
    fid = d.fitted("fit-composition", f"NNLS on relative error with one trimmed refit and 5-fold CV, of the {target} "
                                      "end-to-end latency on the raw block-table sum, blocks with layers, layers "
                                      "and a constant (hmt/profile/composition.py)",
                   ["block-table", "composition-calibration"])
    entry = _fit_entry(result.fit, fid, COMPOSITION_UNITS)
    entry["batch"] = quantity(result.model.batch, "count", fid)
    entry["applies_to"] = "Predictor.block_sum_ms at this batch; raw_block_sum_ms is the uncorrected sum"
    entry["fitted_to"] = "normalised_ms" if normalised else "measured_ms"
    d.doc.setdefault("models", {})["latency_composition"] = entry
    m = result.model
    d.note(f"composition correction of the block-table sum (batch {m.batch}, {result.fit.n} variants): T = "
           f"{m.a_scale:.3g}*raw + {m.b_ms_per_block:.3g} ms/block + {m.l_ms_per_layer:.3g} ms/layer + {m.c_ms:.3g} "
           "ms" + (f"; cross-validated MAPE {result.fit.cv_mape:.1%}" if result.fit.cv_mape is not None else ""))


def _metrics_doc(metrics: Any, pid: str) -> dict[str, Any]:
    return {k: quantity(v, "count" if k == "n" else "1" if k == "kendall_tau" else "fraction", pid)
            for k, v in metrics.as_dict().items() if np.isfinite(v)}


def validation_section(d: _Doc, options: ProfileOptions, runner: Any, loaded: Any, progress: ProgressCallback,
                       drift: Any = None) -> Any:
    from hmt.profile.validate import VALIDATION_UNITS, validate_variants

    warmup, repeats = options.timing
    predictor = Predictor(d.profile)
    processes = options.validate_load_processes if options.rpc is None else 0
    exclude: frozenset[str] = frozenset()
    if "composition_calibration" in d.profile.tables:
        exclude = frozenset(str(a) for a in d.profile.table("composition_calibration").arch_id)
    result = validate_variants(loaded.net, loaded.space, predictor, runner, n=options.validate,
                               rng=np.random.default_rng(options.seed), warmup=warmup, repeats=repeats,
                               batch=options.validate_batch, load_processes=processes, exclude=exclude,
                               progress=progress, drift=drift)
    corrected = predictor.corrects(options.validate_batch)
    what = ("the block-table sum with the composition correction (raw sum scored too, as *_raw)" if corrected
            else "the block-table sum")
    pid = d.measured("validation", f"{options.validate} random variants (seed {options.seed}, batch "
                                   f"{options.validate_batch}; none of the {len(exclude)} calibration variants) "
                                   f"materialised, exported and timed end to end vs {what}; then beside "
                                   f"{processes} busy process(es) vs the load-aware prediction; "
                                   + _timing_how(drift))
    d.profile.add_table("validation", result.table, units=VALIDATION_UNITS, source=pid)
    section: dict[str, Any] = {"prediction": "block-table sum, composition-corrected" if corrected
                               else "block-table sum"}
    section["idle"] = _metrics_doc(result.idle, pid)
    if result.loaded is not None:
        section["loaded"] = _metrics_doc(result.loaded, pid)
    if result.idle_raw is not None:
        section["idle_raw"] = _metrics_doc(result.idle_raw, pid)
    if result.loaded_raw is not None:
        section["loaded_raw"] = _metrics_doc(result.loaded_raw, pid)
    if result.idle_normalised is not None:
        section["idle_normalised"] = _metrics_doc(result.idle_normalised, pid)
    if result.idle_raw_normalised is not None:
        section["idle_raw_normalised"] = _metrics_doc(result.idle_raw_normalised, pid)
    d.doc["validation"] = section
    return result


# A reference whose per-round medians differ by more than this ratio flags a drift.
DRIFT_NOTE_RATIO = 1.10


def drift_section(d: _Doc, options: ProfileOptions, drift: Any) -> None:
    """The reference variant's per-round times (table ``drift_reference``), the drift figure
    (``drift.ratio`` = max/min of its per-round medians over the idle phases) and a note."""
    import pandas as pd

    from hmt.profile.interleave import REFERENCE_UNITS, ref_rows

    if not drift.phases:
        return
    rows = [row for phase, timing in drift.phases for row in ref_rows(phase, timing)]
    table = pd.DataFrame(rows, columns=list(REFERENCE_UNITS))
    st = drift.settings
    pid = d.measured("drift-reference", f"reference variant {drift.reference_id} (seed {options.seed}, reference "
                                        f"stream; batch {options.validate_batch}) timed in bursts between the "
                                        f"interleaved variants: {st.rounds} rounds per group of <= {st.group_size}; "
                                        "one row per round (median, spread, conditions over the round)")
    d.profile.add_table("drift_reference", table, units=REFERENCE_UNITS, source=pid)
    idle = table[~table.phase.str.endswith("loaded")]
    section: dict[str, Any] = {"reference": drift.reference_id, "rounds": quantity(st.rounds, "count", pid),
                               "group_size": quantity(st.group_size, "count", pid),
                               "level_ms": quantity(float(drift.level_ms), "ms", pid),
                               "normalised_fit": bool(options.drift_normalise)}
    ratio = float(idle.median_ms.max() / idle.median_ms.min()) if len(idle) else float("nan")
    if np.isfinite(ratio):
        section["ratio"] = quantity(ratio, "1", pid)
    section["phases"] = {phase: {"ratio": quantity(t.drift_ratio, "1", pid),
                                 "min_ms": quantity(min(r.median_ms for r in t.reference_rounds), "ms", pid),
                                 "max_ms": quantity(max(r.median_ms for r in t.reference_rounds), "ms", pid)}
                         for phase, t in drift.phases}
    d.doc["drift"] = section
    if not np.isfinite(ratio):
        return
    span = f"{idle.median_ms.min():.4g}-{idle.median_ms.max():.4g} ms (max/min {ratio:.2f})"
    if ratio > DRIFT_NOTE_RATIO:
        d.note(f"drift: the reference variant's per-round median ranged {span} over {len(idle)} idle rounds: the "
               "machine changed during the run. Variants were interleaved, so it hit them alike; "
               "validation.idle_normalised scores the reference-normalised times (validation.idle the raw ones)")
    else:
        d.note(f"drift: the reference variant's per-round median ranged {span} over {len(idle)} idle rounds "
               f"(within {DRIFT_NOTE_RATIO - 1:.0%}: steady)")


def summary(profile: DeviceProfile) -> dict[str, Any]:
    out: dict[str, Any] = {"device": profile.name, "device_id": profile.device_id,
                           "origin": profile.doc["device"]["origin"]}
    for key in ("benchmarks.peak_gemm_gmacs", "benchmarks.peak_conv_gmacs", "benchmarks.dram_read_gbps",
                "benchmarks.cache_read_gbps", "models.latency.cv_mape", "models.energy.cv_mape", "models.load.alpha",
                "validation.idle.kendall_tau", "validation.idle.mape", "validation.idle.within_10pct",
                "validation.loaded.within_20pct", "validation.idle_raw.kendall_tau", "validation.idle_raw.mape",
                "validation.idle_raw.within_10pct", "validation.loaded_raw.within_20pct",
                "models.latency_composition.coefficients.a_scale",
                "models.latency_composition.coefficients.b_ms_per_block",
                "models.latency_composition.coefficients.l_ms_per_layer",
                "models.latency_composition.coefficients.c_ms", "models.latency_composition.cv_mape",
                "validation.idle_normalised.kendall_tau", "validation.idle_normalised.mape",
                "validation.idle_normalised.within_10pct", "drift.ratio", "drift.level_ms"):
        value = profile.get_value(key)
        if value is not None:
            out[key] = value
    models = profile.doc.get("models", {})
    if "latency" in models:
        out["latency_form"] = models["latency"]["form"]
    if "energy" in models:
        out["energy_calibrated"] = bool(models["energy"].get("calibrated"))
    if "block_latency" in profile.tables:
        out["block_table_rows"] = len(profile.tables["block_latency"])
    if "load" in models:
        out["load_model_identifiable"] = bool(models["load"].get("identifiable", True))
    return out


def _config(options: ProfileOptions, out_dir: Path) -> dict[str, Any]:
    from hmt.artifacts.paths import relative_to_artifact

    config = dataclasses.asdict(options)
    config["supernet"] = relative_to_artifact(options.supernet, out_dir) if options.supernet else None
    config["power_options"] = {k: relative_to_artifact(v, out_dir) if k == "path" and v else str(v)
                               for k, v in options.power_options.items()}
    config["batches"] = list(options.batches)
    return config


def write_measured(out_dir: Path, profile: DeviceProfile, options: ProfileOptions, loaded: Any,
                   validation: Any, metrics: dict[str, Any], *, force: bool = False) -> None:
    extra = {"validation.png": validation.plot_png} if validation is not None else {}
    parents = (loaded.artifact,) if loaded is not None else ()
    write_profile_artifact(profile, out_dir, config=_config(options, out_dir), parents=parents, extra_files=extra,
                           metrics=metrics, force=force, inputs=[p for p in (options.power_options.get("path"),) if p])


def write_estimated(out_dir: Path, profile: DeviceProfile, options: ProfileOptions, *,
                    force: bool = False) -> ProfileRun:
    info = summary(profile)
    write_profile_artifact(profile, out_dir, config=_config(options, out_dir), metrics=info, force=force)
    notes = [f"{profile.name}: estimated profile from profiles/ (datasheet and published figures, cited inside); "
             "nothing was measured; pass --rpc host:port --key NAME to measure the device"]
    return ProfileRun(out_dir, profile, info, notes)
