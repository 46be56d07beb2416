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

from hmt.errors import InputError, ModelError

Step = Callable[[dict[str, Any]], list[Any]]


def ort_step(model: bytes | str, config: Any, device: str = "cpu") -> Step:
    """One graph under ONNX Runtime with an :class:`~hmt.fuse.engines.ort.OrtConfig`."""
    import onnxruntime as ort

    from hmt.fuse.engines import ort as ort_engine

    try:
        session = ort.InferenceSession(
            model, ort_engine.session_options(config), providers=ort_engine.providers(device)
        )
    except Exception as exc:
        raise ModelError(f"ONNX Runtime cannot load a graph with {config.name}: {exc}") from exc
    return lambda feeds: session.run(None, feeds)


def tvm_step(library: Path, input_name: str, device: str = "cpu") -> Step:
    """One graph compiled by TVM (a Relax VM module exported as a shared library)."""
    import tvm
    from tvm import relax

    from hmt.fuse.engines.tvm import flatten_outputs

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    try:
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), dev)
    except Exception as exc:
        raise ModelError(f"{library}: TVM cannot load the module ({exc})") from exc
    main = vm["main"]

    def step(feeds: dict[str, Any]) -> list[Any]:
        value = feeds[input_name]
        out = main(value if isinstance(value, tvm.runtime.Tensor) else tvm.runtime.tensor(value, dev))
        if device == "cuda":
            dev.sync()
        return flatten_outputs(out)

    return step


def chain(steps: list[Step], first_feeds: dict[str, Any], next_inputs: list[str]) -> Callable[[], list[Any]]:
    """Run the steps in order: step k+1 reads step k's first output under ``next_inputs[k]``."""
    if len(steps) != len(next_inputs) + 1:
        raise ValueError("one input name per step after the first")
    if len(steps) == 1:
        return lambda: steps[0](first_feeds)

    def run() -> list[Any]:
        features = steps[0](first_feeds)[0]
        for step, name in zip(steps[1:-1], next_inputs[:-1], strict=True):
            features = step({name: features})[0]
        return steps[-1]({next_inputs[-1]: features})

    return run


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
    from hmt.fuse.engines.ort import OrtConfig

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
    if spec["engine"] == "ort" and spec["graphs"] == "chain":
        # The whole path merged into one graph (hmt.fuse.engines.ort.merge_chain): one call.
        return chain([ort_step(str(artifact.file(spec["onnx"])), OrtConfig(**spec["ort"]), device)], feeds, [])
    steps: list[Step] = []
    for file in path:
        if spec["engine"] == "ort":
            onnx_file = graphs[file]["onnx"]["file"] if spec["graphs"] == "fused" else file
            root = artifact.root if spec["graphs"] == "fused" else Path(artifact.manifest.parents[0].path)
            steps.append(ort_step(str(root / onnx_file), OrtConfig(**spec["ort"]), device))
        else:
            steps.append(tvm_step(artifact.file(spec["libraries"][file]), graphs[file]["input_name"], device))
    return chain(steps, feeds, inputs[1:])
