"""ONNX Runtime as a fuse engine: session configurations to measure, and a portable saved model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.errors import ModelError
from hmt.runtime.ort import OrtOptions, ort_session, providers_for_device, resolve_providers
from hmt.runtime.ort import session_options as session_options

if TYPE_CHECKING:
    import numpy as np
    import onnx

# fuse's name for the runtime's session configuration: what fuse measures is what serve
# rebuilds (hmt.runtime.ort.OrtOptions, written into the report with ``to_json``).
OrtConfig = OrtOptions


def providers(device: str) -> list[str]:
    """ORT providers for ``device``; CUDA falls back to the CPU provider when ORT here has none
    (the CPU-only wheel): see :func:`effective_device`."""
    chosen, _ = resolve_providers(providers_for_device(device))
    return chosen


def effective_device(device: str) -> str:
    """Where ORT really runs for ``device``: "cuda" only if the CUDA provider is installed."""
    return "cuda" if "CUDAExecutionProvider" in providers(device) else "cpu"


def make_runner(model_bytes: bytes, config: OrtConfig, feeds: dict[str, np.ndarray], *, device: str = "cpu") -> Any:
    """A zero-argument callable running one inference."""
    session = ort_session(model_bytes, config, providers=providers_for_device(device), what="the model")
    return lambda: session.run(feeds)


def merge_chain(models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """One graph computing a chain: graph k+1's single input is graph k's first output.

    The full-depth path of a segmented variant (every segment, then the last exit head)
    as one ONNX model, so ONNX Runtime runs it in one call: each graph boundary otherwise
    costs a Python ``run`` call, an output copy to numpy and, at the ``all`` level, a
    layout reorder out of and back into NCHWc (15-50 us each on a 2-core EPYC, as much
    as the compute of the smallest CIFAR variants). Graphs after the first get a prefix
    (``chain<k>_``) so names cannot collide; the merged model keeps the first graph's
    input name and the last graph's outputs.
    """
    from onnx import compose

    if not models:
        raise ModelError("an empty chain cannot be merged")
    merged = models[0]
    for k, following in enumerate(models[1:], start=1):
        if len(following.graph.input) != 1:
            raise ModelError(f"graph {k} of the chain has {len(following.graph.input)} inputs; chains pass one tensor")
        following = compose.add_prefix(following, f"chain{k}_")
        try:
            merged = compose.merge_models(
                merged, following,
                io_map=[(merged.graph.output[0].name, following.graph.input[0].name)],
                outputs=[o.name for o in following.graph.output],
            )
        except Exception as exc:  # onnx raises ValueError/ValidationError on opset or name clashes
            raise ModelError(f"the chain cannot be merged into one graph at graph {k}: {exc}") from exc
    _dedupe_opsets(merged)
    return merged


def _dedupe_opsets(model: onnx.ModelProto) -> None:
    """merge_models concatenates opset imports (one ``""`` entry per graph); ORT's quantiser
    then finds no unique ai.onnx opset and refuses the merged graph, so keep one per domain."""
    seen: dict[str, int] = {}
    for entry in model.opset_import:
        seen[entry.domain] = max(seen.get(entry.domain, 0), entry.version)
    del model.opset_import[:]
    for domain, version in seen.items():
        model.opset_import.add(domain=domain, version=version)


def save_portable(model: onnx.ModelProto, path: Path) -> dict[str, Any]:
    """Let ORT rewrite the graph at the basic level (standard ONNX ops only) and save it.

    Returns ``{"ort_only": bool, "level": ...}``: the extended and all levels write
    com.microsoft ops and NCHWc layouts other runtimes cannot read, so they are never
    saved; if even the basic result holds a non-standard op, it is marked ORT-only.
    """
    import onnx

    ort_session(model.SerializeToString(), OrtConfig(level="basic"), what="the model to optimise",
                optimized_model_path=path)
    saved = onnx.load(str(path))
    domains = sorted({node.domain for node in saved.graph.node if node.domain not in ("", "ai.onnx")})
    return {"ort_only": bool(domains), "level": "basic", "non_standard_domains": domains}
