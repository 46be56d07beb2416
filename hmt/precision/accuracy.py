"""Accuracy of a variant's ONNX chain on held-out images, and the bound a quantised one must meet.

A quantised variant's accuracy is measured, never assumed: the float chain and the
quantised chain run the same held-out images through ONNX Runtime (every exit, one
image at a time since the graphs are static), and the quantised one is refused when its
last exit loses more than ``max_drop`` (a fraction: 0.01 is one point) against the
float chain. Both figures go into the report either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hmt.errors import UsageError, VerificationError

if TYPE_CHECKING:
    import numpy as np
    import onnx

DEFAULT_MAX_DROP = 0.01


def _session(model: onnx.ModelProto | bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def chain_accuracy(segments: Sequence[onnx.ModelProto], exits: Sequence[onnx.ModelProto], x: np.ndarray,
                   y: np.ndarray, *, threads: int = 0) -> list[float]:
    """Top-1 accuracy at every exit of a chain on normalised inputs ``x`` (N, ...) with labels ``y``."""
    import numpy as np

    if len(x) != len(y) or len(x) == 0:
        raise UsageError(f"accuracy needs as many labels as inputs (>0), got {len(x)} inputs and {len(y)} labels")
    seg = [_session(m, threads) for m in segments]
    heads = [_session(m, threads) for m in exits]
    seg_in = [s.get_inputs()[0].name for s in seg]
    head_in = [h.get_inputs()[0].name for h in heads]
    correct = np.zeros(len(seg), dtype=np.int64)
    for xi, yi in zip(x, y, strict=True):
        features = xi[None, ...].astype(np.float32, copy=False)
        for k, (s, h) in enumerate(zip(seg, heads, strict=True)):
            features = s.run(None, {seg_in[k]: features})[0]
            logits = h.run(None, {head_in[k]: features})[0]
            correct[k] += int(np.argmax(logits[0]) == int(yi))
    return [float(c) / len(y) for c in correct]


@dataclass(frozen=True)
class AccuracyCheck:
    """A quantised chain's accuracy against its float chain on the same held-out images."""

    precision: str
    samples: int
    float_per_exit: tuple[float, ...]
    quantised_per_exit: tuple[float, ...]
    max_drop: float

    @property
    def drop(self) -> float:
        """Loss at the last exit, as a fraction (0.01 = one point); negative when it gained."""
        return self.float_per_exit[-1] - self.quantised_per_exit[-1]

    @property
    def passed(self) -> bool:
        return self.drop <= self.max_drop

    def to_json(self) -> dict[str, Any]:
        return {"precision": self.precision, "samples": self.samples,
                "float_accuracy_per_exit": [round(a, 6) for a in self.float_per_exit],
                "accuracy_per_exit": [round(a, 6) for a in self.quantised_per_exit],
                "drop_points": round(100 * self.drop, 4), "max_drop_points": round(100 * self.max_drop, 4),
                "passed": self.passed}


def check_accuracy(precision: str, float_chain: tuple[Sequence[onnx.ModelProto], Sequence[onnx.ModelProto]],
                   quant_chain: tuple[Sequence[onnx.ModelProto], Sequence[onnx.ModelProto]], x: np.ndarray,
                   y: np.ndarray, *, max_drop: float = DEFAULT_MAX_DROP, threads: int = 0,
                   float_per_exit: Sequence[float] | None = None) -> AccuracyCheck:
    """Measure both chains (the float one unless ``float_per_exit`` is already known)."""
    if not 0.0 <= max_drop <= 1.0:
        raise UsageError(f"max accuracy drop must be a fraction in [0, 1], got {max_drop}")
    reference = list(float_per_exit) if float_per_exit is not None else chain_accuracy(*float_chain, x, y,
                                                                                        threads=threads)
    measured = chain_accuracy(*quant_chain, x, y, threads=threads)
    return AccuracyCheck(precision, len(y), tuple(reference), tuple(measured), max_drop)


def require_within(check: AccuracyCheck, *, what: str) -> AccuracyCheck:
    """``check`` if it passed; else VerificationError naming the variant and both accuracies."""
    if not check.passed:
        raise VerificationError(
            f"{what}: {check.precision} accuracy {100 * check.quantised_per_exit[-1]:.2f}% is "
            f"{100 * check.drop:.2f} points below fp32's {100 * check.float_per_exit[-1]:.2f}% on {check.samples} "
            f"held-out images; the bound is {100 * check.max_drop:.2f} points (raise --max-accuracy-drop to accept it)")
    return check


__all__ = ["DEFAULT_MAX_DROP", "AccuracyCheck", "chain_accuracy", "check_accuracy", "require_within"]
