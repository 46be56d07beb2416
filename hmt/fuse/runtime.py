"""Run what ``fuse`` chose: a fused artifact's variant as one callable, with no torch.

``load_fused_runner(fused_dir, variant)`` rebuilds the chosen candidate (ORT session
options + portable ONNX, the merged chain graph, or the TVM shared libraries) for the
full-depth path (the model, or every segment then the last exit head). ``candidate=``
picks another measured candidate instead (benchmarks compare them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hmt.errors import InputError
from hmt.runtime.chain import feeds_chain
from hmt.runtime.ort import OrtOptions, ort_session, providers_for_device
from hmt.runtime.tvm import tvm_feeds_fn

Step = Callable[[dict[str, Any]], list[Any]]


def ort_step(model: bytes | str, config: OrtOptions | None, device: str = "cpu") -> Step:
    """One graph under ONNX Runtime with an :class:`~hmt.runtime.ort.OrtOptions` (built by hmt.runtime)."""
    session = ort_session(model, config, providers=providers_for_device(device), what="a fused graph")
    return session.run


def tvm_step(library: Path, input_name: str, device: str = "cpu") -> Step:
    """One graph compiled by TVM (a Relax VM module exported as a shared library)."""
    return tvm_feeds_fn(library, input_name, device)


def chain(steps: list[Step], first_feeds: dict[str, Any], next_inputs: list[str]) -> Callable[[], list[Any]]:
    """Run the steps in order: step k+1 reads step k's first output under ``next_inputs[k]``."""
    return feeds_chain(steps, first_feeds, next_inputs)


def load_fused_runner(
    fused_dir: Path | str,
    variant: str,
    feeds: dict[str, Any],
    *,
    candidate: str | None = None,
    device: str | None = None,
) -> Callable[[], list[Any]]:
    """A zero-argument callable running ``variant`` of a fused artifact on ``feeds`` (numpy inputs)."""
    from hmt.artifacts import load_artifact

    artifact = load_artifact(fused_dir, kind="fused")
    report = artifact.read_json("report.json")
    entry = next((v for v in report["variants"] if v["name"] == variant), None)
    if entry is None:
        names = ", ".join(v["name"] for v in report["variants"])
        raise InputError(f"{fused_dir}: no variant {variant!r} (has {names})")
    label = candidate or entry["choice"]["candidate"]
    spec = entry["candidates"].get(label)
    if spec is None:
        raise InputError(f"{fused_dir}: variant {variant!r} has no candidate {label!r}")
    device = device or report.get("device", "cpu")
    graphs = {g["file"]: g for g in entry["graphs"]}
    path = entry["timed_path"]
    inputs = [graphs[f]["input_name"] for f in path]
    ort_options = OrtOptions.from_mapping(spec["ort"], f"{fused_dir}: {label}.ort") if "ort" in spec else None
    if spec["engine"] == "ort" and spec.get("ort_device") == "cpu":
        device = "cpu"  # fuse measured this candidate on the host's CPU (even on a GPU device)
    if spec["engine"] == "ort" and spec["graphs"] == "chain":
        # The whole path merged into one graph (hmt.fuse.engines.ort.merge_chain): one call.
        return chain([ort_step(str(artifact.file(spec["onnx"])), ort_options, device)], feeds, [])
    steps: list[Step] = []
    parent_root: Path | None = None
    for file in path:
        if spec["engine"] == "ort":
            onnx_file = graphs[file]["onnx"]["file"] if spec["graphs"] == "fused" else file
            if spec["graphs"] != "fused" and parent_root is None:
                parent_root = _converted_root(artifact, fused_dir)
            root = artifact.root if spec["graphs"] == "fused" else parent_root
            assert root is not None
            steps.append(ort_step(str(root / onnx_file), ort_options, device))
        else:
            steps.append(tvm_step(artifact.file(spec["libraries"][file]), graphs[file]["input_name"], device))
    return chain(steps, feeds, inputs[1:])


def _converted_root(artifact: Any, fused_dir: Path | str) -> Path:
    """The converted artifact the fused one was built from (its graphs run unfused), found
    relative to the fused artifact and checked by manifest sha256."""
    from hmt.artifacts.lineage import find_parent

    record = artifact.manifest.parents[0]
    found = find_parent(artifact, record)
    if found is None:
        raise InputError(f"{fused_dir}: the converted artifact it was fused from ({record.path}, relative to it) "
                         "is gone or was rebuilt; this choice runs its unfused graphs")
    return Path(found.root)
