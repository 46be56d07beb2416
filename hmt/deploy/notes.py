"""The notes a bundle carries for its user: what its target, engines, profile and precisions mean on the device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hmt.bundle import BundleVariant
from hmt.deploy.targets import Target


def target_notes(target: Target, engines: tuple[str, ...], pareto_profile: str | None, profile_id: str) -> list[str]:
    """What the bundle's notes say about its target and engines, and about the profile its front was searched on."""
    notes: list[str] = []
    if "tvm" in engines:
        tvm = target.tvm_target
        notes.append(f"TVM libraries (.so) are compiled for {tvm.get('mtriple')} mcpu={tvm.get('mcpu')}"
                     + (" with the cross-compiler " + str(target.cross_compiler) if target.cross_compiler else "")
                     + "; loading them needs the TVM 0.27 runtime on the device")
    notes.append("ONNX graphs (.onnx) run under ONNX Runtime on any target")
    if target.gpu is not None:
        notes.append(f"GPU {target.gpu.name} ({target.gpu.cuda_arch}): {target.gpu.code}")
    if pareto_profile and pareto_profile != profile_id:
        notes.append(f"latency/energy/memory of the variants are the pareto front's predictions for profile "
                     f"{pareto_profile}, not for the bundled profile {profile_id}; rerun pareto with this "
                     "profile for predictions on this device")
    if not target.matches_host() or "tvm" in engines:
        notes.append("preferred_engine is what fuse measured fastest on the build host; serve may re-measure")
    notes.extend(target.notes)
    return notes


def quantised_notes(bundled: Sequence[BundleVariant]) -> list[str]:
    """A note on the quantised variants (their precisions and which engines run them), if any."""
    quantised = sorted({str(v.extra.get("precision")) for v in bundled} - {"fp32", "None"})
    if not quantised:
        return []
    return [f"{'/'.join(quantised)} variants are quantised ONNX graphs (int8: QDQ, which ONNX Runtime's "
            "CPU provider runs with integer kernels and TensorRT reads as explicit quantisation; fp16: "
            "for GPU providers); their accuracy was measured on held-out images by pareto and convert"]


def budget_notes(points: Mapping[str, Mapping[str, Any]], latency_ms: float | None,
                 memory_mb: float | None) -> list[str]:
    """A note per budget that no bundled variant meets by the front's predictions (``points``: each
    variant's front point): the bundle is still built, and serve then runs the closest and says so."""
    notes = []
    for budget, key, unit, flag in ((latency_ms, "latency_ms", "ms", "--latency-ms"),
                                    (memory_mb, "memory_mb", "MB", "--memory-mb")):
        if budget is None or not points:
            continue
        arch, point = min(points.items(), key=lambda item: float(item[1][key]))
        if float(point[key]) > budget:
            notes.append(f"{flag} {budget:g}: no bundled variant meets it by the front's predictions (the "
                         f"least, {arch}, {float(point[key]):.3g} {unit}); serve will run it and say so")
    return notes
