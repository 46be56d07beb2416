"""``profile_device``: measure a device, fit the models, write the profile artifact.

Order: facts -> micro-benchmarks -> cache-hit curve -> probe layers (eq. 2 fits) -> block
latency table (with a supernet) -> background-load model -> energy (defaults, or
calibrated from a power source) -> composition correction of the block-table sum
(calibration variants, optional) -> validation (optional) -> drift report of the reference
variant both were interleaved with -> one atomic write. Nothing is
written until every step has succeeded, so a failed or interrupted run never replaces a
good profile.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import hmt.profile.benchmarks as bench
import hmt.profile.stages as stages
from hmt.errors import UsageError
from hmt.profile.composition import MIN_CALIBRATION_VARIANTS
from hmt.profile.devices import device_spec, shipped_profile
from hmt.profile.document import (
    _LATENCY_UNITS,
    CROWDHMTWARE,
    DEFAULT_CALIBRATION_VARIANTS,
    ProfileOptions,
    ProfileRun,
    _Doc,
    _fit_entry,
    default_energy_doc,
    energy_rows,
)
from hmt.profile.facts import DeviceFacts, collect_facts, device_id
from hmt.profile.features import LayerFeature, layer_features
from hmt.profile.fits import LATENCY_FORMS, fit_latency
from hmt.profile.parsers import find_plateaus, hit_rate_curve
from hmt.profile.power.base import PowerSource
from hmt.profile.power.registry import create_power_source
from hmt.profile.predictor import HitRateCurve
from hmt.profile.probes import probe_grid
from hmt.profile.schema import (
    quantity,
)
from hmt.profile.timing import ROW_UNITS
from hmt.progress import ProgressCallback, no_progress

ENGINES = ("onnxruntime", "torch", "tvm")


def _facts_section(d: _Doc, facts: DeviceFacts) -> None:
    pid = d.measured("facts", "/proc/cpuinfo, /sys/devices/system/cpu, psutil, platform, NVML, package metadata")
    section: dict[str, Any] = {
        "cpu_model": facts.cpu_model, "arch": facts.arch, "os": facts.os, "python": facts.python,
        "simd": list(facts.simd), "virtualised": facts.virtualised, "runtimes": facts.runtimes,
        "cores_logical": quantity(facts.cores_logical, "count", pid),
        "memory_bytes": quantity(facts.memory_bytes, "byte", pid),
        "caches": {k: quantity(v, "byte", pid) for k, v in facts.caches_bytes.items()},
        "gpus": [{k: (quantity(v, "byte" if k.endswith("bytes") else "MHz" if k.endswith("mhz") else "W", pid)
                      if isinstance(v, (int, float)) and k != "index" else str(v)) for k, v in g.items()}
                 for g in facts.gpus],
    }
    if facts.cores_physical:
        section["cores_physical"] = quantity(facts.cores_physical, "count", pid)
    if facts.freq_mhz_current:
        section["freq_mhz_current"] = quantity(facts.freq_mhz_current, "MHz", pid)
    if facts.freq_mhz_max:
        section["freq_mhz_max"] = quantity(facts.freq_mhz_max, "MHz", pid)
    d.doc["facts"] = section
    for note in facts.notes:
        d.note(note)


def _benchmarks(d: _Doc, options: ProfileOptions, facts: DeviceFacts, progress: ProgressCallback) -> HitRateCurve:
    import pandas as pd

    settings = bench.BenchmarkSettings.quick() if options.quick else bench.BenchmarkSettings()
    if options.processor == "cuda":  # a GPU needs large GEMMs to approach its peak (fp32, TF32 off by default)
        settings = dataclasses.replace(settings, gemm_sizes=(2048, 4096, 8192), conv_hw=112)
    threads_all = options.threads or facts.cores_logical
    section: dict[str, Any] = {}
    progress("micro-benchmarks", 0, 4, "peak MACs")
    peak_rows = []
    for threads in sorted({1, threads_all}):
        for result in bench.measure_peak_macs(settings, threads=threads, device=options.processor):
            peak_rows.append({"kernel": result.name, "threads": threads, "macs": result.macs,
                              "median_s": result.seconds.median, "iqr_s": result.seconds.iqr,
                              "gmacs": result.gmacs})
    peak = pd.DataFrame(peak_rows)
    pid = d.measured("peak", f"fp32 torch.mm, numpy matmul and a 3x3 conv on {options.processor}; median of "
                             f"{settings.repeats} batches of >= {settings.min_time_s}s; threads 1 and {threads_all}")
    d.profile.add_table("peak_macs", peak, units={"kernel": "name", "threads": "count", "macs": "MAC",
                                                   "median_s": "s", "iqr_s": "s", "gmacs": "GMAC/s"}, source=pid)
    # Peak = the best observed over kernels and thread counts (the row says which); on a
    # shared machine all-thread runs can lose to one thread when another job holds a core.
    for key, prefix in (("peak_gemm_gmacs", "gemm"), ("peak_conv_gmacs", "conv")):
        rows = peak[peak.kernel.str.startswith(prefix)]
        top = rows.loc[rows.gmacs.idxmax()]
        section[key] = quantity(float(top.gmacs), "GMAC/s", pid, kernel=str(top.kernel), threads=int(top.threads))
    single = peak[(peak.threads == 1) & peak.kernel.str.startswith("gemm")]
    section["peak_gemm_gmacs_1thread"] = quantity(float(single.gmacs.max()), "GMAC/s", pid, threads=1)

    progress("micro-benchmarks", 1, 4, "memory bandwidth")
    bw = bench.measure_bandwidth(settings)
    pid_bw = d.measured("bandwidth", "numpy copyto (read+write bytes) and BLAS dot (read) over a reused buffer per "
                                     "working-set size; median of repeats; small sizes include call overhead")
    bw_frame = pd.DataFrame([{"size_bytes": p.size_bytes, "copy_gbps": p.copy_gbps, "read_gbps": p.read_gbps}
                             for p in bw])
    d.profile.add_table("bandwidth", bw_frame, units={"size_bytes": "byte", "copy_gbps": "GB/s",
                                                      "read_gbps": "GB/s"}, source=pid_bw)
    levels = find_plateaus(bw_frame.size_bytes.tolist(), bw_frame.read_gbps.tolist())
    section["memory_levels"] = [{"name": lv.name, "max_bytes": quantity(lv.max_bytes, "byte", pid_bw),
                                 "read_gbps": quantity(lv.bandwidth_gbps, "GB/s", pid_bw)} for lv in levels]
    section["dram_read_gbps"] = quantity(float(bw_frame.read_gbps.iloc[-1]), "GB/s", pid_bw)
    section["cache_read_gbps"] = quantity(float(bw_frame.read_gbps.max()), "GB/s", pid_bw)

    progress("micro-benchmarks", 2, 4, "cold vs warm")
    cw = bench.measure_cold_warm(settings)
    sizes = [p.size_bytes for p in cw]
    rates = hit_rate_curve(sizes, [p.warm_gbps for p in cw], cold_dram_gbps=cw[-1].cold_gbps)
    pid_cw = d.measured("cold-warm", f"BLAS dot read once after flushing the caches with a {settings.flush_bytes >> 20}"
                                     " MiB write (cold, median of trials) vs repeated (warm); hit rate = (t_miss - "
                                     "t_warm)/(t_miss - t_hit) per byte, AdaScale eq. 5 generalised (parsers.py)")
    d.profile.add_table("cache_hit_rate", pd.DataFrame({
        "size_bytes": sizes, "cold_gbps": [p.cold_gbps for p in cw], "warm_gbps": [p.warm_gbps for p in cw],
        "hit_rate": rates}), units={"size_bytes": "byte", "cold_gbps": "GB/s", "warm_gbps": "GB/s",
                                    "hit_rate": "fraction"}, source=pid_cw)

    progress("micro-benchmarks", 3, 4, "perf stat")
    counters = bench.run_perf_stat()
    perf: dict[str, Any] = {"available": counters.available}
    if counters.available:
        pid_perf = d.measured("perf", "perf stat -e cache-references,cache-misses,LLC-loads,LLC-load-misses over a "
                                      "16 MiB streaming read, 50 passes")
        perf["counts"] = {k: quantity(v, "count", pid_perf) for k, v in counters.counts.items()}
        if counters.cache_hit_rate is not None:
            perf["cache_hit_rate"] = quantity(counters.cache_hit_rate, "fraction", pid_perf)
    else:
        perf["reason"] = counters.reason
        d.note(f"hardware cache counters unavailable ({counters.reason}); the cache-hit rate comes from cold vs "
               "warm timings")
    section["perf_counters"] = perf
    progress("micro-benchmarks", 4, 4, None)
    d.doc["benchmarks"] = section
    return HitRateCurve(tuple(sizes), tuple(float(r) for r in rates))


def _probe_fits(d: _Doc, options: ProfileOptions, runner: Any, curve: HitRateCurve,
                progress: ProgressCallback) -> tuple[list[tuple[str, Any, tuple[int, ...], list[LayerFeature]]], str]:
    """Times the probe grid; fits both eq. 2 forms; returns probe sessions for later steps."""
    import pandas as pd

    warmup, repeats = options.timing
    specs = probe_grid(quick=options.quick)
    rows, samples, probes = [], [], []
    for index, spec in enumerate(specs):
        module, shape = spec.build()
        feats = layer_features(module, shape)
        m = runner.time(module, (1, *shape), warmup=warmup, repeats=repeats)
        f = feats[0]
        rows.append({"probe": spec.name, "macs": f.macs, "bytes_moved": f.bytes_moved, "intensity": f.intensity,
                     "hit_rate": curve(f.bytes_moved), **m.row()})
        samples.append(feats)
        probes.append((spec.name, module, (1, *shape), feats))
        progress("probe layers", index + 1, len(specs), spec.name)
    frame = pd.DataFrame(rows)
    pid = d.measured("probes", f"{len(specs)} single layers timed alone on {runner.engine}; {warmup} warm-up, "
                               f"median of {repeats} runs; conditions recorded per row")
    d.profile.add_table("probe_latency", frame, units={"probe": "name", "macs": "MAC", "bytes_moved": "byte",
                                                       "intensity": "MAC/byte", "hit_rate": "fraction", **ROW_UNITS},
                        source=pid)
    eps = [[curve(f.bytes_moved) for f in s] for s in samples]
    fits = {form: fit_latency(samples, eps, frame.latency_ms.tolist(), form=form, seed=options.seed,
                              labels=frame.probe.tolist())
            for form in LATENCY_FORMS}
    fits_doc = {}
    for form, fit in fits.items():
        fid = d.fitted(f"fit-latency-{form}", f"CrowdHMTware eq. 2 ({form}) by NNLS on relative error, one trimmed "
                                              "refit, 5-fold CV",
                       ["probes", "cold-warm"])
        fits_doc[form] = _fit_entry(fit, fid, _LATENCY_UNITS)
    def error(form: str) -> float:
        # Cross-validated error picks the form once there are enough probes for 5 folds of 6;
        # below that a fold's error swings with single contended rows, so in-sample MAPE decides.
        cv = fits[form].cv_mape
        return cv if cv is not None and fits[form].n >= 30 else fits[form].mape

    chosen = min(fits, key=error)
    d.doc.setdefault("models", {})["latency_fits"] = fits_doc
    d.doc["models"]["latency"] = fits_doc[chosen]
    return probes, chosen


def _check_options(options: ProfileOptions, device: str) -> None:
    """Refuse option combinations that cannot be measured, before any work."""
    if options.engine not in ENGINES:
        raise UsageError(f"unknown engine {options.engine!r}; choose from {', '.join(ENGINES)}")
    if options.validate and options.supernet is None:
        raise UsageError("--validate needs --supernet: the variants to validate come from a supernet")
    calibration = options.calibration_variants
    if calibration and options.supernet is None:
        raise UsageError("--calibrate-variants needs --supernet: the variants come from a supernet")
    if calibration < 0 or 0 < calibration < MIN_CALIBRATION_VARIANTS:
        raise UsageError(f"--calibrate-variants {calibration}: 0 (no correction) or >= {MIN_CALIBRATION_VARIANTS} "
                         "(four coefficients, cross-validated)")
    if options.threads is not None and options.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {options.threads}")
    if (options.repeats is not None and options.repeats < 1) or (options.warmup is not None and options.warmup < 0):
        raise UsageError(f"--repeats must be >= 1 and --warmup >= 0, got {options.repeats} and {options.warmup}")
    if options.interleave_rounds < 0:
        raise UsageError(f"--interleave-rounds {options.interleave_rounds}: 0 (one variant after the other) or more")
    if options.drift_normalise and not options.interleave_rounds:
        raise UsageError("--drift-normalise needs interleaved timing (--interleave-rounds >= 1)")
    if any(b < 1 for b in options.batches) or 1 not in options.batches:
        raise UsageError(f"--batch sizes must be >= 1 and include 1, got {list(options.batches)}")
    if options.validate_batch not in options.batches:
        raise UsageError(f"--validate-batch {options.validate_batch}: the block table has no rows at that batch; "
                         f"add --batch {options.validate_batch} (table batches: {list(options.batches)})")
    if device == "host" and options.rpc is not None:
        raise UsageError("--rpc profiles a remote device: name it with --device (e.g. raspberry-pi-4b)")
    if options.rpc is not None and options.power and options.power != "trace":
        raise UsageError(f"--power {options.power} reads this machine; a remote device needs --power-trace")


def _threads_note(d: _Doc, options: ProfileOptions, thread_ms: dict[int, float]) -> None:
    device: dict[str, Any] = d.doc["device"]
    device["threads_measured_ms"] = {str(t): round(ms, 4) for t, ms in thread_ms.items()}
    d.note(f"engine threads {options.threads}, measured: the largest variant end to end at "
           + ", ".join(f"{t} thread(s) {ms:.3f} ms" for t, ms in thread_ms.items())
           + f"; the fewest within {stages.THREADS_GAIN:.0%} of the fastest (deploy gives the bundle this count)")


def profile_device(out_dir: Path | str, options: ProfileOptions, *, power_source: PowerSource | None = None,
                   progress: ProgressCallback = no_progress, force: bool = False) -> ProfileRun:
    """Profile a device and write the profile artifact to ``out_dir`` (atomically).

    ``out_dir`` is checked first (:func:`hmt.artifacts.outputs.check_output_dir`; ``force``
    replaces an artifact of another kind)."""
    from hmt.artifacts.outputs import check_output_dir
    from hmt.profile.schema import ARTIFACT_KIND

    out_dir = Path(out_dir)
    inputs = [p for p in (options.supernet, options.power_options.get("path")) if p]
    check_output_dir(out_dir, kind=ARTIFACT_KIND, inputs=inputs, force=force)
    spec = device_spec(options.device)
    _check_options(options, spec.name)
    if spec.name != "host" and options.rpc is None:
        if options.supernet is not None or options.power is not None or power_source is not None:
            raise UsageError(f"{spec.name} is not this machine: measuring it (block table, energy) needs "
                             "--rpc host:port --key NAME; without --rpc its estimated profile is written as is")
        return stages.write_estimated(out_dir, shipped_profile(spec.name), options, force=force)
    # Everything that can be missing is opened first, so an absent meter or a bad supernet
    # fails in a second rather than after minutes of benchmarks.
    if power_source is None and options.power is not None:
        power_source = create_power_source(options.power, **dict(options.power_options))
    loaded = stages.open_supernet(options.supernet) if options.supernet is not None else None
    thread_ms: dict[int, float] | None = None
    if options.threads is None and options.engine == "onnxruntime" and options.processor == "cpu" \
            and options.rpc is None and loaded is not None:
        threads_chosen, thread_ms = stages.measure_threads(options, loaded, progress)
        options = dataclasses.replace(options, threads=threads_chosen)
    runner = stages.make_runner(options)
    facts = collect_facts(with_gpu=options.processor == "cuda" or options.rpc is None)
    dev_id = device_id(facts, engine=runner.engine, engine_version=runner.version, processor=options.processor)
    if options.rpc is not None:
        dev_id = f"{spec.name}-rpc-{options.rpc_key}_{runner.engine}{'.'.join(runner.version.split('.')[:2])}"
    d = _Doc(spec.name, dev_id, origin="measured", engine=runner.engine, engine_version=runner.version,
             threads=options.threads)
    d.note("timings taken on a machine other jobs may share: medians and spreads are recorded with the CPU "
           "frequency and background load of each measurement")
    if thread_ms is not None:
        _threads_note(d, options, thread_ms)
    if options.rpc is None:
        _facts_section(d, facts)
        curve = _benchmarks(d, options, facts, progress)
    else:
        curve = stages.remote_curve(d, spec.name, options)
    probes, chosen = _probe_fits(d, options, runner, curve, progress)
    d.note(f"latency model used for eq. 2 predictions: {chosen} (the lower cross-validated error; in-sample "
           "below 30 probes)")
    if loaded is not None:
        stages.block_table_section(d, options, runner, loaded, curve, progress, out_dir=out_dir)
    if options.load_model and options.rpc is None:
        stages.load_section(d, options, runner, probes, loaded, progress)
    stages.energy_section(d, options, runner, probes, curve, power_source, progress)
    calibration = options.calibration_variants
    drift = stages.drift_reference(options, runner, loaded) if calibration or options.validate else None
    if calibration:
        stages.composition_section(d, options, runner, loaded, progress, drift)
    validation = None
    if options.validate:
        validation = stages.validation_section(d, options, runner, loaded, progress, drift)
    if drift is not None:
        stages.drift_section(d, options, drift)
    summary = stages.summary(d.profile)
    stages.write_measured(out_dir, d.profile, options, loaded, validation, summary, force=force)
    return ProfileRun(out_dir, d.profile, summary, list(d.doc["notes"]), validation)


__all__ = ["CROWDHMTWARE", "DEFAULT_CALIBRATION_VARIANTS", "ENGINES", "ProfileOptions", "ProfileRun",
           "default_energy_doc", "energy_rows", "profile_device"]
