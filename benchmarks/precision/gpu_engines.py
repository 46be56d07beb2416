"""GPU host: CUDA EP / TensorRT EP (fp32, fp16, int8) vs torch eager vs ORT CPU, batch 1 and 64, and fuse's choice.

For each variant of ``--supernet`` and each batch size:

- ``torch-eager`` (and ``torch-eager-fp16``): the materialised variant (BN re-estimated on
  the stored calibration images) on ``cuda``, input already on the device, logits copied
  back (``.cpu()``, which synchronises);
- ONNX Runtime on the full-depth path merged into one graph (fuse's chain candidate),
  numpy in and out (the copies are part of the time, as serve pays them):
  ``ort-cpu`` (fp32, int8), ``ort-cuda`` (fp32, fp16), ``ort-tensorrt`` (fp32, fp16 via
  ``trt_fp16_enable``, int8 from the QDQ graph) when the wheel carries those providers;
- ``fuse``: ``hmt fuse --device cuda`` on the same converted graphs (ORT candidates,
  and TVM CUDA with ``--fuse-tvm``); its chosen candidate is rebuilt from the fused
  artifact and timed in the loop below beside every engine ("fuse >= 1.0x best" is the
  issue's target: ``fuse.best_over_fuse``, both medians from that one loop; fuse's own
  median is ``fuse.median_ms``).

All of a variant's engines at one batch size, and fuse's chosen candidate rebuilt from its
fused artifact, alternate in one timing loop (rounds of bursts of 20 calls, the first 4
dropped, median of round medians: as fuse times), so ``fuse.best_over_fuse`` compares
within one loop. fp16 / int8 outputs are compared with fp32's: top-1
agreement on the stored calibration images. A provider that is absent or fails is
recorded as such, never silently dropped. It also runs on a CPU-only machine (GPU rows
then say "unavailable"), which is how it was tested.

On a GPU host whose onnxruntime-gpu comes from a wheel (CUDA/cuDNN from the nvidia-* pip
packages torch installed), ``onnxruntime.preload_dlls()`` is called first where this ORT has
it, so the CUDA provider finds those libraries; what it did is recorded under
``machine.preload_dlls``. Every engine either has a timing or a line in ``unavailable``
saying why; a variant whose conversion fails gets an ``error`` row and the run goes on; the
JSON is rewritten after every (variant, batch) row, and ``--budget-s`` stops starting new
rows once the run has used that much wall time (so a lease's per-call limit is kept).

    python -m benchmarks.precision.gpu_engines --supernet hmt/data/embedded/supernet-cifar-resnet56 \
        --variant largest --variant smallest --random 2 --batches 1 64 --budget-s 400 --out $OUT/gpu_precision.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

from benchmarks.harness import Driver  # noqa: E402


def log(msg: str) -> None:
    print(f"[gpu_precision {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def preload_cuda_libraries() -> str:
    """Let a pip-installed onnxruntime-gpu find CUDA/cuDNN from the nvidia-* wheels (ORT >= 1.21).

    Called before torch is imported, so both load the same libraries; returns what happened."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return f"onnxruntime {ort.__version__} has no preload_dlls"
    try:
        preload()
    except Exception as exc:  # noqa: BLE001 - a failed preload is reported; the CUDA EP then says why it fails
        return f"preload_dlls failed: {type(exc).__name__}: {str(exc)[:300]}"
    return "preload_dlls() called"


def machine(preload: str) -> dict[str, Any]:
    import onnxruntime as ort
    import torch

    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "torch": torch.__version__, "onnxruntime": ort.__version__,
                            "providers": ort.get_available_providers(), "cuda": torch.cuda.is_available(),
                            "load_avg_start": list(os.getloadavg()), "preload_dlls": preload,
                            "onnxruntime_file": ort.__file__, "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["torch_cuda"] = torch.version.cuda
    return info


class ProviderFellBack(RuntimeError):
    """ORT listed the provider but built the session without it (its libraries did not load)."""


# provider -> why it is unusable in this process, so a missing TensorRT is tried once, not per row
BROKEN_PROVIDERS: dict[str, str] = {}


def ort_runner(model: Any, x: Any, provider: str, *, trt_fp16: bool = False, trt_int8: bool = False) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if provider == "TensorrtExecutionProvider":
        trt = {"trt_fp16_enable": trt_fp16, "trt_int8_enable": trt_int8,
               "trt_engine_cache_enable": True, "trt_engine_cache_path": tempfile.gettempdir()}
        providers: list[Any] = [(provider, trt), "CUDAExecutionProvider", "CPUExecutionProvider"]
    elif provider == "CUDAExecutionProvider":
        providers = [provider, "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    if session.get_providers()[0] != provider:
        raise ProviderFellBack(f"unavailable: {provider} is listed by onnxruntime but the session fell back to "
                               f"{session.get_providers()} (its libraries did not load)")
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: x})[0]


def torch_runner(net: Any, x: Any, *, half: bool) -> Any:
    import copy

    import torch

    model = copy.deepcopy(net).cuda().eval()
    xt = torch.from_numpy(x).cuda()
    if half:
        model, xt = model.half(), xt.half()

    def run() -> Any:
        with torch.no_grad():
            out = model(xt)
        return out.float().cpu().numpy()

    return run


def agreement(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


def bench_variant(loaded: Any, arch_id: str, batch: int, args: argparse.Namespace, calibration: Any,
                  tmp: Path) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort
    import torch

    from hmt.convert import SupernetSource, convert_model
    from hmt.convert.graph import load_onnx
    from hmt.convert.pipeline import load_converted
    from hmt.fuse.engines.ort import merge_chain
    from hmt.fuse.engines.timing import measure_rounds
    from hmt.precision.quantize import QuantOptions, quantize_chain

    work = tmp / f"{arch_id.replace('.', '_')}-b{batch}"
    convert_model(SupernetSource(args.supernet, (arch_id,), batch=batch), work / "converted")
    artifact, report = load_converted(work / "converted")
    (entry,) = report["variants"]
    graphs = sorted(entry["graphs"], key=lambda g: (g["role"], g["index"]))
    segs = [load_onnx(artifact.file(g["file"])) for g in graphs if g["role"] == "segment"]
    exits = [load_onnx(artifact.file(g["file"])) for g in graphs if g["role"] == "exit"]
    # int8 calibration runs the static batch-`batch` graphs: group the images by batch.
    usable = (min(len(calibration), args.calibration_samples) // batch) * batch or batch
    groups = np.resize(calibration, (usable, *calibration.shape[1:])).reshape(-1, batch, *calibration.shape[1:])
    chains = {"fp32": (segs, exits),
              "fp16": quantize_chain(segs, exits, groups, "fp16", batched=True),
              "int8": quantize_chain(segs, exits, groups, "int8", batched=True,
                                     options=QuantOptions(calibration_samples=len(groups)))}
    merged = {p: merge_chain([*s, e[-1]]) for p, (s, e) in chains.items()}
    x = calibration[:batch] if len(calibration) >= batch else np.resize(calibration, (batch, *calibration.shape[1:]))
    x = np.ascontiguousarray(x, dtype=np.float32)
    runners: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    providers = ort.get_available_providers()
    plan = [("ort-cpu fp32", "fp32", "CPUExecutionProvider", {}), ("ort-cpu int8", "int8", "CPUExecutionProvider", {}),
            ("ort-cuda fp32", "fp32", "CUDAExecutionProvider", {}),
            ("ort-cuda fp16", "fp16", "CUDAExecutionProvider", {}),
            ("ort-tensorrt fp32", "fp32", "TensorrtExecutionProvider", {}),
            ("ort-tensorrt fp16", "fp32", "TensorrtExecutionProvider", {"trt_fp16": True}),
            ("ort-tensorrt int8", "int8", "TensorrtExecutionProvider", {"trt_int8": True})]
    for label, precision, provider, extra in plan:
        if provider not in providers:
            unavailable[label] = f"{provider} not in this onnxruntime ({providers})"
            continue
        if provider in BROKEN_PROVIDERS:  # e.g. TensorRT listed by the wheel but its libraries absent
            unavailable[label] = BROKEN_PROVIDERS[provider]
            continue
        try:
            runners[label] = ort_runner(merged[precision], x, provider, **extra)
        except ProviderFellBack as exc:
            BROKEN_PROVIDERS[provider] = unavailable[label] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a provider refusing a graph is a result to record
            unavailable[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if torch.cuda.is_available():
        try:
            net = loaded.materialize(loaded.space.parse(arch_id))
            runners["torch-eager fp32"] = torch_runner(net, x, half=False)
            runners["torch-eager fp16"] = torch_runner(net, x, half=True)
        except Exception as exc:  # noqa: BLE001 - recorded, the ORT rows still run
            unavailable["torch-eager"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    else:
        unavailable["torch-eager fp32"] = unavailable["torch-eager fp16"] = "torch.cuda is not available"
    outputs: dict[str, Any] = {}
    for label, run in list(runners.items()):
        try:
            outputs[label] = np.asarray(run())  # first call: also where a provider fails lazily
        except Exception as exc:  # noqa: BLE001 - a run that fails is a result to record
            unavailable[label] = f"first run failed: {type(exc).__name__}: {str(exc)[:300]}"
            del runners[label]
    reference = outputs.get("ort-cpu fp32")
    # fuse first, then its chosen candidate rebuilt from the fused artifact and timed in the
    # same loop as every engine above: "fuse >= 1.0x the best" is then read off one loop.
    fuse = run_fuse(work, args)
    fuses = {FUSE_LABEL: (fuse, work / "fused")}
    if args.old_fuse_code is not None:  # the old code's choice, timed in the same loop
        fuses[OLD_FUSE_LABEL] = (run_fuse_subprocess(work, args), work / "fused-old")
    for label, (result, fused_dir) in fuses.items():
        if "variant" not in result:
            continue
        try:
            from hmt.fuse.runtime import load_fused_runner

            feeds = {segs[0].graph.input[0].name: x}
            chosen = load_fused_runner(fused_dir, result["variant"], feeds)
            outputs[label] = np.asarray(chosen()[0])
            runners[label] = lambda chosen=chosen: chosen()[0]
        except Exception as exc:  # noqa: BLE001 - recorded; fuse's own figure stays
            unavailable[label] = f"{type(exc).__name__}: {str(exc)[:300]}"
    # Rounds of alternating bursts (20 calls, 4 dropped; median of round medians), as fuse times.
    timings = measure_rounds(runners, rounds=max(3, -(-args.repeats // 16)), burst=20, drop=4, warmup=10,
                             drop_slower_than=None)
    row: dict[str, Any] = {"arch_id": arch_id, "batch": batch, "unavailable": unavailable, "engines": {}}
    for label, timing in timings.items():
        row["engines"][label] = {**timing.to_json(), "per_image_ms": round(timing.median_ms / batch, 5)}
        if reference is not None:
            row["engines"][label]["top1_agreement_with_ort_cpu_fp32"] = agreement(outputs[label], reference)
    engines = {k: t for k, t in timings.items() if k not in (FUSE_LABEL, OLD_FUSE_LABEL)}
    if engines:
        best = min(engines.values(), key=lambda t: t.median_ms)
        row["best"] = {"engine": best.name, "median_ms": round(best.median_ms, 4)}
        fp32 = [t for t in engines.values() if "fp32" in t.name]
        if fp32:  # fuse chooses among fp32 graphs: its fair yardstick is the best fp32 engine
            best32 = min(fp32, key=lambda t: t.median_ms)
            row["best_fp32"] = {"engine": best32.name, "median_ms": round(best32.median_ms, 4)}
        for label, (result, _) in fuses.items():
            if label not in timings:
                continue
            here = timings[label].median_ms
            result["median_ms_in_this_loop"] = round(here, 4)
            result["best_over_fuse"] = round(best.median_ms / here, 3)
            if fp32:
                result["best_fp32_over_fuse"] = round(best32.median_ms / here, 3)
            result["timed_in"] = "this loop, beside the engines above (fuse's own median is median_ms)"
    row["fuse"] = fuse
    if OLD_FUSE_LABEL in fuses:
        row["fuse_old_code"] = fuses[OLD_FUSE_LABEL][0]
    return row


FUSE_LABEL = "fuse's choice"
OLD_FUSE_LABEL = "fuse's choice (old code)"
OLD_FUSE_SNIPPET = """
import json, sys
from hmt.fuse import FuseOptions, fuse_model
engines = tuple(sys.argv[4].split(","))
result = fuse_model(sys.argv[1], sys.argv[2], options=FuseOptions(engines=engines, device=sys.argv[3],
                                                                   repeats=int(sys.argv[5]), warmup=10))
(variant,) = result.variants
print(json.dumps({"choice": variant.engine, "variant": variant.name, "median_ms": round(variant.latency_ms, 4),
                  "ort_device": result.report["variants"][0]["choice"].get("ort_device")}))
"""


def run_fuse_subprocess(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """fuse from the tree at ``--old-fuse-code`` (first on PYTHONPATH), in a child process."""
    import subprocess

    engines = "ort,tvm" if args.fuse_tvm else "ort"
    device = "cuda" if args.fuse_device == "cuda" else "cpu"
    path = os.pathsep.join([str(args.old_fuse_code), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
    proc = subprocess.run([sys.executable, "-c", OLD_FUSE_SNIPPET, str(work / "converted"), str(work / "fused-old"),
                           device, engines, str(args.repeats)], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"device": device, "code": str(args.old_fuse_code), "error": proc.stderr[-400:]}
    return {"device": device, "code": str(args.old_fuse_code), **json.loads(proc.stdout.strip().splitlines()[-1])}


def run_fuse(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from hmt.fuse import FuseOptions, fuse_model

    engines = ("ort", "tvm") if args.fuse_tvm else ("ort",)
    device = "cuda" if args.fuse_device == "cuda" else "cpu"
    try:
        result = fuse_model(work / "converted", work / "fused", options=FuseOptions(
            engines=engines, device=device, repeats=args.repeats, warmup=10))
    except Exception as exc:  # noqa: BLE001 - HmtError or a provider's own error: recorded, the run goes on
        return {"device": device, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    (variant,) = result.variants
    report = result.report["variants"][0]
    return {"device": device, "engines": list(engines), "choice": variant.engine, "variant": variant.name,
            "median_ms": round(variant.latency_ms, 4), "ort_device": report["choice"].get("ort_device"),
            "against_others": report["choice"].get("against_others"),
            "timed_in": "fuse's own loop only (its choice could not be rebuilt here)"}


BENCH = Driver(
    baseline="torch eager and ONNX Runtime on the CPU, the same variants in the same loop",
    needs="a CUDA GPU and a supernet (--supernet)",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--supernet", type=Path, required=True)
    parser.add_argument("--variant", action="append", default=[], help="arch id, largest or smallest (repeat)")
    parser.add_argument("--random", type=int, default=0)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--calibration-samples", type=int, default=256)
    parser.add_argument("--fuse-device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--fuse-tvm", action="store_true", help="let fuse try TVM too (CUDA compile: slow)")
    parser.add_argument("--old-fuse-code", type=Path, default=None,
                        help="a tree with an older hmt package (git archive COMMIT hmt): its fuse's choice is timed "
                             "in the same loop too, as \"fuse's choice (old code)\"")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=0,
                        help="start no new (variant, batch) row after this many seconds (0: no limit)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    preload = preload_cuda_libraries()  # before torch loads its own copies of the CUDA libraries

    import numpy as np

    from hmt.supernet import load_supernet

    loaded = load_supernet(args.supernet)
    ids = []
    for v in args.variant or ["largest", "smallest"]:
        pick = {"largest": loaded.space.largest, "smallest": loaded.space.smallest}.get(v)
        ids.append(pick().arch_id if pick else loaded.space.parse(v).arch_id)
    rng = np.random.default_rng(args.seed)
    ids += [loaded.space.sample(rng).arch_id for _ in range(args.random)]
    ids = list(dict.fromkeys(ids))
    calibration = np.concatenate([b.numpy() for b in loaded.calibration_batches()]).astype(np.float32)
    result: dict[str, Any] = {"machine": machine(preload), "command": " ".join(sys.argv),
                              "supernet": str(args.supernet), "rows": []}
    log(f"{len(ids)} variants x batches {args.batches}; providers {result['machine']['providers']}")
    with tempfile.TemporaryDirectory(prefix="gpu-precision-") as tmp:
        for arch_id in ids:
            for batch in args.batches:
                elapsed = time.perf_counter() - started
                if args.budget_s and elapsed > args.budget_s:
                    why = f"budget {args.budget_s:.0f}s used ({elapsed:.0f}s)"
                    result.setdefault("skipped", []).append({"arch_id": arch_id, "batch": batch, "why": why})
                    log(f"{arch_id} b{batch}: skipped, budget used")
                    continue
                t0 = time.perf_counter()
                try:
                    row = bench_variant(loaded, arch_id, batch, args, calibration, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the others' rows
                    row = {"arch_id": arch_id, "batch": batch, "error": f"{type(exc).__name__}: {str(exc)[:400]}",
                           "engines": {}, "unavailable": {}, "fuse": {}}
                row["row_s"] = round(time.perf_counter() - t0, 1)
                result["rows"].append(row)
                summary = ", ".join(f"{k} {v['median_ms']:.3f}" for k, v in row["engines"].items())
                log(f"{arch_id} b{batch} ({row['row_s']}s): {summary or row.get('error')}; "
                    f"unavailable {sorted(row['unavailable'])}; fuse {row['fuse'].get('choice')} "
                    f"{row['fuse'].get('median_ms')} {row['fuse'].get('error', '')}")
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=2) + "\n")  # partial results survive a timeout
    result["machine"]["load_avg_end"] = list(os.getloadavg())
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
