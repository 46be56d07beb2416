"""Peak resident memory of a variant under ONNX Runtime, with and without ORT's memory plan.

hmt's tensor-lifetime plan (``hmt.fuse.memory_plan``) is a prediction: no engine places
tensors at its offsets. The plan that *acts* is ORT's own: with ``enable_mem_pattern``
ORT records the tensor lifetimes of the first run and serves every later run from one
pre-planned block, and the CPU arena keeps freed buffers for reuse. This module measures
what they do to the process: each configuration runs in a fresh Python process (so
nothing earlier in this one inflates the high-water mark), loads the timed path's graphs,
runs them, and reports the high-water mark of its resident set after the runs minus its
resident set after importing ONNX Runtime and numpy (the interpreter's own share). On
Linux the high-water mark is reset past the imports (``/proc/self/clear_refs``), so a
transient peak while importing does not hide a small model; elsewhere ``ru_maxrss`` is
used (and says so). The median of ``repeats`` processes is kept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hmt.errors import DeviceError

_CHILD = r"""
import json, resource, sys
root, spec = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, root)
import numpy as np
import onnxruntime as ort
from hmt.fuse.engines.ort import OrtConfig, session_options


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(field)


try:  # Linux: reset the high-water mark so importing doesn't count, then read VmRSS / VmHWM
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    read_peak = lambda: status_bytes("VmHWM")
    base = status_bytes("VmRSS")
    how = "VmHWM after resetting it past the imports (/proc/self/clear_refs 5)"
except OSError:
    scale = 1 if sys.platform == "darwin" else 1024
    read_peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    base = read_peak()
    how = "ru_maxrss (includes any transient peak of the imports)"
sessions = [ort.InferenceSession(f, session_options(OrtConfig(**spec["ort"])), providers=["CPUExecutionProvider"])
            for f in spec["files"]]
loaded = read_peak()
x = np.zeros(spec["shape"], dtype=spec["dtype"])
for _ in range(spec["runs"]):
    features = x
    for s in sessions:
        features = s.run(None, {s.get_inputs()[0].name: features})[0]
peak = read_peak()
print(json.dumps({"import_bytes": base, "after_load_bytes": loaded, "peak_bytes": peak, "how": how}))
"""

SETTINGS = {
    "ort_memory_plan_on": {"mem_pattern": True, "cpu_arena": True},
    "ort_memory_plan_off": {"mem_pattern": False, "cpu_arena": False},
}


def _hmt_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def peak_rss(files: Sequence[Path | str], ort_config: dict[str, Any], *, shape: Sequence[int], dtype: str = "float32",
             runs: int = 20, repeats: int = 3, timeout_s: float = 120.0) -> dict[str, Any]:
    """Peak RSS of running the chain ``files`` (graph k+1 reads graph k's first output) in fresh processes."""
    spec = {"files": [str(f) for f in files], "ort": ort_config, "shape": list(shape), "dtype": dtype, "runs": runs}
    samples = []
    for _ in range(max(1, repeats)):
        try:
            done = subprocess.run([sys.executable, "-c", _CHILD, _hmt_root(), json.dumps(spec)], capture_output=True,
                                  text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise DeviceError(f"peak RSS measurement took over {timeout_s:.0f} s") from exc
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise DeviceError(f"peak RSS measurement failed (exit {done.returncode}): {tail[0]}")
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    samples.sort(key=lambda s: s["peak_bytes"] - s["import_bytes"])
    mid = samples[len(samples) // 2]
    return {"peak_over_import_bytes": mid["peak_bytes"] - mid["import_bytes"],
            "load_over_import_bytes": mid["after_load_bytes"] - mid["import_bytes"],
            "run_over_load_bytes": mid["peak_bytes"] - mid["after_load_bytes"],
            "samples_peak_over_import_bytes": [s["peak_bytes"] - s["import_bytes"] for s in samples],
            "processes": len(samples), "runs_per_process": runs, "how": mid["how"]}


def memory_report(writer: Any, spec: dict[str, Any], path: Sequence[Any], planned_peak_bytes: int, *,
                  repeats: int = 3) -> dict[str, Any]:
    """Peak RSS of a fused variant's timed path with ORT's memory plan on and off.

    ``spec`` is the per-graph candidate fuse chose; its ORT settings are kept (a TVM choice
    is measured with ORT's defaults, the portable fallback every bundle carries).
    """
    files = [writer.path(g.report["onnx"]["file"]) for g in path]
    first = next(iter(path[0].feeds.values()))
    base = dict(spec.get("ort") or {}) if spec.get("engine") == "ort" else {}
    out: dict[str, Any] = {
        "hmt_plan": {"planned_peak_bytes": planned_peak_bytes,
                     "status": "predicted only: no engine places tensors at hmt's offsets; ORT's memory pattern "
                               "(its own lifetime plan) is the plan that runs, measured below"},
        "measured_with": "ORT CPU provider, fused graphs of the timed path, fresh process per sample",
    }
    for label, settings in SETTINGS.items():
        out[label] = peak_rss(files, {**base, **settings}, shape=first.shape, dtype=str(first.dtype),
                              repeats=repeats)
    on = out["ort_memory_plan_on"]["run_over_load_bytes"]
    off = out["ort_memory_plan_off"]["run_over_load_bytes"]
    out["run_bytes_off_minus_on"] = off - on
    return out


__all__ = ["SETTINGS", "memory_report", "peak_rss"]
