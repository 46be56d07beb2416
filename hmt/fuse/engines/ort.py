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

    @property
    def name(self) -> str:
        threads = "default" if self.intra_op_threads == 0 else str(self.intra_op_threads)
        spin = "" if self.allow_spinning else ",nospin"
        return f"ort[{self.level},threads={threads}{spin}]"

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "intra_op_threads": self.intra_op_threads, "allow_spinning": self.allow_spinning}


def session_options(config: OrtConfig) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort_optimization_level(config.level)
    options.intra_op_num_threads = config.intra_op_threads
    options.log_severity_level = 3
    if not config.allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
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
