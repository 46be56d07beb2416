"""``hmt fuse``: fusion passes, memory plan and the fastest measured engine per variant."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from commands._options import DebugOpt, ForceOpt, JsonOpt, QuietOpt, SeedOpt
from commands._output import Output
from commands.app import app, run_command

_EPILOG = """
**Examples**

Fuse, plan memory, compile with TVM, measure ORT and TVM here, keep the fastest:

    hmt fuse runs/converted --out runs/fused

Only some fusion classes, ORT only:

    hmt fuse runs/converted --pass conv-batchnorm --pass channel-wise --engine ort --out runs/fused

MetaSchedule tuning (slow: minutes per model); the database is reused across runs and variants:

    hmt fuse runs/converted --tune-trials 400 --tuning-dir runs/tvm-tuning --out runs/fused

Every candidate is checked against ORT on the converted graph before it is timed; the
timings, the choice and the memory plans are in OUT/report.json and the manifest.
Timing runs candidates in rounds of alternating bursts of --burst back-to-back calls, the
first --drop of each untimed (the first call after each pause is reported apart as
cold_median_ms); a candidate's median is the median of its round medians, and candidates
within the measured round-to-round noise are tied (a tie goes to ORT's defaults). --burst 1
times every call after a pause instead, the rate of a server that idles between requests.
"""


def _pass_choice() -> type[Enum]:
    # The choices are the registry's keys, so the help never drifts from the passes.
    from hmt.graph.passes.registry import fusion_pass_names

    return Enum("PassChoice", {name: name for name in fusion_pass_names()}, type=str)  # type: ignore[return-value]


PassChoice = _pass_choice()


class EngineChoice(str, Enum):
    ort = "ort"
    tvm = "tvm"


class DeviceChoice(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


@app.command("fuse", epilog=_EPILOG)
def fuse_command(
    converted: Annotated[Path, typer.Argument(help="A converted artifact directory (from hmt convert).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")] = Path(
        "runs/fused"
    ),
    passes: Annotated[list[PassChoice] | None, typer.Option(  # type: ignore[valid-type]
        "--pass", help="Fusion pass to run (repeatable; default: all).")] = None,
    engine: Annotated[list[EngineChoice] | None, typer.Option(
        "--engine", help="Engine to try (repeatable; default: both).")] = None,
    device: Annotated[DeviceChoice, typer.Option(
        "--device", help="cpu, or cuda (TVM CUDA target, ORT CUDA provider when installed).")] = DeviceChoice.cpu,
    tune_trials: Annotated[int, typer.Option(
        "--tune-trials", help="MetaSchedule trials per graph (0: no tuning).")] = 0,
    tuning_dir: Annotated[Path | None, typer.Option(
        "--tuning-dir", help="Tuning database directory, reused across runs (default OUT/../tvm-tuning).")] = None,
    repeats: Annotated[int, typer.Option(
        "--repeats", help="Timed calls per candidate, at least; they come in rounds of --burst minus --drop "
        "calls (at least 3 rounds).")] = 112,
    warmup: Annotated[int, typer.Option("--warmup", help="Warm-up runs per candidate.")] = 3,
    burst: Annotated[int, typer.Option(
        "--burst", help="Back-to-back calls per visit of a candidate, the first --drop untimed (serve's rate "
        "under load). 1: a pause before every timed call (an idle server's first request).")] = 20,
    drop: Annotated[int, typer.Option("--drop", help="Calls dropped at the start of each burst.")] = 4,
    ort_parallel: Annotated[bool, typer.Option(
        "--ort-parallel/--no-ort-parallel", help="Also time ORT's parallel execution mode (independent branches "
        "at once on inter-op threads); chosen only if it measures faster.")] = True,
    measure_rss: Annotated[bool, typer.Option(
        "--measure-rss", help="Measure each variant's peak RSS in fresh processes with ORT's memory plan "
        "(memory pattern + arena) on and off; hmt's own plan is a prediction, reported beside it.")] = False,
    force: ForceOpt = False,
    seed: SeedOpt = 0,
    json_mode: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Apply the five fusion classes (each verified against ONNX Runtime), plan activation
    memory by tensor lifetimes, build ORT and TVM Relax candidates, measure them here and
    keep the fastest per variant. Writes optimised ONNX (portable), TVM .so modules,
    memory plans and a report."""

    def body(output: Output) -> None:
        import os

        # TVM's idle workers otherwise spin and slow the candidate timed after them.
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        from hmt.fuse import FuseOptions, fuse_model

        options = FuseOptions(
            passes=tuple(str(getattr(p, "value", p)) for p in passes) if passes else None,
            engines=tuple(e.value for e in engine) if engine else ("ort", "tvm"),
            device=device.value,
            tune_trials=tune_trials,
            tuning_dir=tuning_dir,
            repeats=repeats,
            warmup=warmup,
            timing_burst=burst,
            timing_drop=drop,
            seed=seed,
            ort_parallel=ort_parallel,
            measure_rss=measure_rss,
        )
        with output.progress() as progress:
            result = fuse_model(converted, out, options=options, progress=progress, force=force)
        rows = []
        for v in result.variants:
            fired = ", ".join(f"{k} x{n}" for k, n in v.fired.items()) or "none"
            # Candidate labels hold brackets ("ort[all,threads=1](chain)"): printed verbatim (no markup).
            rows.append([v.name, v.engine, f"{v.latency_ms:.3f}", f"{v.speedup_vs_ort_default:.2f}x",
                         f"{v.planned_peak_bytes / 1024:.0f}/{v.naive_bytes / 1024:.0f}", fired])
        output.table("fused (ms: median here; memory: hmt's planned/naive KiB, a prediction)",
                     ["variant", "chosen engine", "ms", "vs ORT default", "memory", "fusions fired"], rows)
        output.result(
            {"out": str(out), "metrics": {v.name: {"engine": v.engine, "latency_ms": v.latency_ms,
                                                   "ort_default_ms": v.baseline_ms} for v in result.variants},
             "report": result.report},
            f"wrote {out}: {len(result.variants)} variant(s)",
        )

    run_command(body, json_mode=json_mode, quiet=quiet, debug=debug)
