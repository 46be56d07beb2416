"""ONNX Runtime as a fuse engine: session configurations to measure, and a portable saved model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.convert.graph import ort_optimization_level
from hmt.errors import ModelError

if TYPE_CHECKING:
    import numpy as np
    import onnx

_LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True)
class OrtConfig:
    """A session configuration serve can rebuild: optimisation level and intra-op threads (0 = ORT's default)."""

    level: str = "all"
    intra_op_threads: int = 0
    allow_spinning: bool = True
    # Parallel operators (CrowdHMTware III-C1 (2)): "parallel" runs independent branches of
    # the graph at once on ``inter_op_threads`` (0: ORT's default); fuse measures it.
    execution_mode: str = "sequential"
    inter_op_threads: int = 0
    # ORT's own static memory plan (tensor lifetimes -> one block, reused across runs) and
    # its CPU arena; both on is ORT's default. hmt.fuse.rss measures what they cost in RSS.
    mem_pattern: bool = True
    cpu_arena: bool = True

    @property
    def name(self) -> str:
        threads = "default" if self.intra_op_threads == 0 else str(self.intra_op_threads)
        spin = "" if self.allow_spinning else ",nospin"
        extra = ""
        if self.execution_mode != "sequential":
            extra += f",{self.execution_mode}" + (f",inter={self.inter_op_threads}" if self.inter_op_threads else "")
        extra += "" if self.mem_pattern else ",nomempattern"
        extra += "" if self.cpu_arena else ",noarena"
        return f"ort[{self.level},threads={threads}{spin}{extra}]"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"level": self.level, "intra_op_threads": self.intra_op_threads,
                                "allow_spinning": self.allow_spinning}
        # Only what differs from ORT's defaults, so readers that predate these fields still load it.
        if self.execution_mode != "sequential" or self.inter_op_threads:
            data |= {"execution_mode": self.execution_mode, "inter_op_threads": self.inter_op_threads}
        if not self.mem_pattern or not self.cpu_arena:
            data |= {"mem_pattern": self.mem_pattern, "cpu_arena": self.cpu_arena}
        return data


def session_options(config: OrtConfig) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort_optimization_level(config.level)
    options.intra_op_num_threads = config.intra_op_threads
    options.log_severity_level = 3
    if not config.allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if config.execution_mode == "parallel":
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        options.inter_op_num_threads = config.inter_op_threads
    elif config.execution_mode != "sequential":
        raise ModelError(f"unknown ORT execution mode {config.execution_mode!r}; expected sequential or parallel")
    options.enable_mem_pattern = config.mem_pattern
    options.enable_cpu_mem_arena = config.cpu_arena
    return options


def providers(device: str) -> list[str]:
    """ORT providers for ``device``; CUDA falls back to the CPU provider when ORT here has none
    (the CPU-only wheel): see :func:`effective_device`."""
    if effective_device(device) == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def effective_device(device: str) -> str:
    """Where ORT really runs for ``device``: "cuda" only if the CUDA provider is installed."""
    import onnxruntime as ort

    if device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return "cuda"
    return "cpu"


def make_runner(model_bytes: bytes, config: OrtConfig, feeds: dict[str, np.ndarray], *, device: str = "cpu") -> Any:
    """A zero-argument callable running one inference, plus the session (for outputs)."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(model_bytes, session_options(config), providers=providers(device))
    except Exception as exc:
        raise ModelError(f"ONNX Runtime cannot load the model with {config.name}: {exc}") from exc

    def run() -> list[np.ndarray]:
        return session.run(None, feeds)

    return run


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
    return merged


def save_portable(model: onnx.ModelProto, path: Path) -> dict[str, Any]:
    """Let ORT rewrite the graph at the basic level (standard ONNX ops only) and save it.

    Returns ``{"ort_only": bool, "level": ...}``: the extended and all levels write
    com.microsoft ops and NCHWc layouts other runtimes cannot read, so they are never
    saved; if even the basic result holds a non-standard op, it is marked ORT-only.
    """
    import onnx
    import onnxruntime as ort

    options = session_options(OrtConfig(level="basic"))
    options.optimized_model_filepath = str(path)
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(f"ONNX Runtime cannot optimise the model: {exc}") from exc
    saved = onnx.load(str(path))
    domains = sorted({node.domain for node in saved.graph.node if node.domain not in ("", "ai.onnx")})
    return {"ort_only": bool(domains), "level": "basic", "non_standard_domains": domains}
