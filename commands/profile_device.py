"""``hmt profile-device``: measure a device and fit its latency/energy models (a "device-profile" artifact)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from commands._options import DebugOpt, ForceOpt, JsonOpt, QuietOpt, SeedOpt
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
**Examples**

This machine, quickly (micro-benchmarks, probe-layer fits, load model; about a minute):

    hmt profile-device --quick --out runs/profile

With a supernet: the block latency table at batch 1 and 8, 12 random variants measured to
fit the composition correction of the block-table sum, and 20 other random variants
validated end to end (idle and beside a process burning a core; raw and corrected sums):

    hmt profile-device --supernet runs/supernet --batch 1 --batch 8 --validate 20 --out runs/profile
    hmt profile-device --supernet runs/supernet --validate 20 --calibrate-variants 0 --out runs/p-raw  # no correction

Energy calibrated from a power source (else eq. 1 with the default 1:6:200 ratios):

    hmt profile-device --monsoon --monsoon-vout 5.0 --out runs/profile
    hmt profile-device --power-trace powertool.csv --trace-start 1764120000.0 --out runs/profile
    hmt profile-device --power rapl --out runs/profile        (also: nvml, ina3221, tegrastats)

A remote board through a TVM RPC tracker (RPC server started there with --key pi4):

    hmt profile-device --device raspberry-pi-4b --rpc 10.0.0.2:9190 --key pi4 \\
        --rpc-target '{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}' \\
        --rpc-cc aarch64-linux-gnu-g++ --supernet runs/supernet --out runs/profile-pi4

A device you cannot reach: its shipped estimated profile (cited figures), as an artifact:

    hmt profile-device --device jetson-nano --out runs/profile-nano

Nothing is written until every step succeeded: a failed run leaves the old profile.
Timings on a shared machine are noisy; each row records CPU frequency and background load.
"""


class EngineChoice(str, Enum):
    onnxruntime = "onnxruntime"
    torch = "torch"
    tvm = "tvm"


class ProcessorChoice(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


@app.command("profile-device", epilog=_EPILOG)
def profile_device_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")] = Path(
        "runs/profile"
    ),
    device: Annotated[str, typer.Option(
        "--device", help="host (measured here), jetson-nano, jetson-xavier-nx, raspberry-pi-4b, generic-aarch64.")
    ] = "host",
    quick: Annotated[bool, typer.Option("--quick", help="Short micro-benchmarks and fewer repeats.")] = False,
    supernet: Annotated[Path | None, typer.Option(
        "--supernet", help="A supernet artifact: adds the block latency table (and enables --validate).")] = None,
    batch: Annotated[list[int] | None, typer.Option(
        "--batch", help="Batch sizes of the block table (repeatable; 1 is always included).")] = None,
    engine: Annotated[EngineChoice, typer.Option(
        "--engine", help="Engine the timings use (torch: eager, the GPU path without onnxruntime-gpu).")
    ] = EngineChoice.onnxruntime,
    processor: Annotated[ProcessorChoice, typer.Option(
        "--processor", help="cpu, or cuda (GPU GEMM peak, NVML facts; ORT needs onnxruntime-gpu).")
    ] = ProcessorChoice.cpu,
    threads: Annotated[int | None, typer.Option(
        "--threads", help="Engine threads (default: measured with --supernet on ONNX Runtime: the fewest threads "
        "within 5% of the fastest for its largest variant, which deploy gives the bundle; else all cores).")] = None,
    power: Annotated[str | None, typer.Option(
        "--power", help="Power source: rapl, nvml, ina3221, tegrastats, fake (see also --monsoon, --power-trace).")
    ] = None,
    monsoon: Annotated[bool, typer.Option("--monsoon", help="Calibrate energy with a Monsoon HVPM over USB.")] = False,
    monsoon_vout: Annotated[float, typer.Option("--monsoon-vout", help="Monsoon main-channel voltage (V).")] = 4.0,
    monsoon_serial: Annotated[int | None, typer.Option("--monsoon-serial", help="Monsoon serial number.")] = None,
    power_trace: Annotated[Path | None, typer.Option(
        "--power-trace", help="A CSV power trace covering the run (time,current,voltage or time,power).")] = None,
    trace_start: Annotated[float | None, typer.Option(
        "--trace-start", help="Unix time of the trace's first row when its times are relative (else aligned by "
                              "the sync pattern).")] = None,
    validate: Annotated[int, typer.Option(
        "--validate", help="Measure N random variants end to end against the prediction.")] = 0,
    calibrate_variants: Annotated[int | None, typer.Option(
        "--calibrate-variants", help="Measure K further random variants end to end and fit the composition "
                                     "correction of the block-table sum to them (default: 12 with --validate, "
                                     "else 0; 0 turns it off). Never reused by validation.")] = None,
    validate_load: Annotated[int, typer.Option(
        "--validate-load", help="Busy processes for the loaded validation run (0: skip it).")] = 1,
    validate_batch: Annotated[int, typer.Option(
        "--validate-batch", help="Batch of the validation runs (one of --batch; on a GPU batch 1 is launch-bound)."
    )] = 1,
    interleave_rounds: Annotated[int, typer.Option(
        "--interleave-rounds", help="Time calibration and validation variants round-robin in R rounds (shuffled "
                                    "per round, groups of <= 10 resident) with a reference variant between them, "
                                    "so a drift of the machine shows and hits all alike; 0: one after the other."
    )] = 5,
    drift_normalise: Annotated[bool, typer.Option(
        "--drift-normalise", help="Fit the composition correction to reference-normalised times (raw and "
                                  "normalised validation are reported either way).")] = False,
    no_load_model: Annotated[bool, typer.Option("--no-load-model", help="Skip the background-load model.")] = False,
    rpc: Annotated[str | None, typer.Option("--rpc", help="TVM RPC tracker host:port of a remote device.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Device key registered with the tracker.")] = None,
    rpc_target: Annotated[str, typer.Option(
        "--rpc-target", help="TVM target: a kind ('llvm') or a JSON dict with mtriple/mcpu.")] = "llvm",
    rpc_cc: Annotated[str | None, typer.Option("--rpc-cc", help="Cross compiler for the remote libraries.")] = None,
    warmup: Annotated[int | None, typer.Option("--warmup", help="Warm-up runs per timing.")] = None,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed runs per measurement (minimum).")] = None,
    export_json: Annotated[Path | None, typer.Option(
        "--export-json", help="Also write the single-file profile (tables inline), as profiles/ ships them.")
    ] = None,
    force: ForceOpt = False,
    seed: SeedOpt = 0,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure a device: facts, peak MACs, memory bandwidth and cache-hit rate, a latency
    table of every block choice, fitted latency (CrowdHMTware eq. 2) and energy (eq. 1)
    models, optional power calibration and validation. Writes a device-profile artifact."""

    def body(output: Output) -> dict[str, Any]:
        from hmt.errors import UsageError
        from hmt.profile import ProfileOptions, profile_device

        chosen = [name for name, on in (("monsoon", monsoon), ("trace", power_trace is not None),
                                         (power or "", power is not None)) if on]
        if len(chosen) > 1:
            raise UsageError(f"choose one power source, got {', '.join(chosen)}")
        power_name = chosen[0] if chosen else None
        power_options: dict[str, Any] = {}
        if power_name == "monsoon":
            power_options = {"vout": monsoon_vout, "serial": monsoon_serial}
        elif power_name == "trace":
            power_options = {"path": power_trace, "start_epoch_s": trace_start}
        options = ProfileOptions(
            device=device, quick=quick, supernet=supernet, batches=tuple(sorted({1, *(batch or [])})),
            engine=engine.value, processor=processor.value, threads=threads, power=power_name,
            power_options=power_options, validate=validate, calibrate_variants=calibrate_variants,
            validate_load_processes=validate_load,
            validate_batch=validate_batch,
            load_model=not no_load_model, rpc=rpc, rpc_key=key, rpc_target=rpc_target, rpc_cc=rpc_cc,
            warmup=warmup, repeats=repeats, seed=seed, interleave_rounds=interleave_rounds,
            drift_normalise=drift_normalise,
        )
        inputs = [p for p in (supernet, power_trace) if p]
        if export_json is not None:
            from hmt.profile.schema import check_profile_json_output

            check_profile_json_output(export_json, inputs=inputs)  # before measuring, not after
            if export_json.resolve().is_relative_to(out.resolve()):
                raise UsageError(f"--export-json {export_json}: inside --out {out}, whose artifact holds only the "
                                 "files its manifest lists (a later load would refuse it); write it beside it")
        with output.progress() as progress:
            result = profile_device(out, options, progress=progress, force=force)
        if export_json is not None:
            from hmt.profile.schema import write_profile_json

            write_profile_json(result.profile, export_json, inputs=inputs)
            output.note(f"single-file profile: {export_json}")
        for note in result.notes:
            output.note(f"note: {note}")
        output.table("profile", ["quantity", "value"], [[k, v] for k, v in result.summary.items()])
        document = {"out": str(result.out_dir), **result.summary, "notes": result.notes}
        output.result(document, human=f"wrote {result.out_dir} ({result.summary['origin']} profile of "
                                      f"{result.summary['device_id']})")
        return document

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)
