"""Verification: outputs of the converted graph(s) under ONNX Runtime vs the reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hmt.errors import VerificationError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


@dataclass(frozen=True)
class Comparison:
    what: str
    max_abs_error: float
    max_rel_error: float  # max abs error / max |reference|
    reference_max_abs: float
    atol: float
    rtol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_error <= self.atol + self.rtol * self.reference_max_abs

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "max_abs_error": float(f"{self.max_abs_error:.6g}"),
            "max_rel_error": float(f"{self.max_rel_error:.6g}"),
            "reference_max_abs": float(f"{self.reference_max_abs:.6g}"),
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
        }


def compare(
    what: str, reference: list[np.ndarray], outputs: list[np.ndarray], *, atol: float, rtol: float
) -> Comparison:
    """Compare output lists; a count or shape mismatch raises VerificationError at once."""
    import numpy as np

    if len(reference) != len(outputs):
        raise VerificationError(f"{what}: {len(outputs)} outputs, reference has {len(reference)}")
    worst, scale = 0.0, 0.0
    for i, (ref, out) in enumerate(zip(reference, outputs, strict=True)):
        if tuple(ref.shape) != tuple(out.shape):
            raise VerificationError(f"{what}: output {i} has shape {tuple(out.shape)}, reference {tuple(ref.shape)}")
        if ref.size == 0:
            continue
        diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        if not np.all(np.isfinite(diff)):
            raise VerificationError(f"{what}: output {i} holds NaN or inf where the reference does not")
        worst = max(worst, float(diff.max()))
        scale = max(scale, float(np.abs(ref.astype(np.float64)).max()))
    rel = worst / scale if scale > 0 else worst
    return Comparison(what, worst, rel, scale, atol, rtol)


def require(comparison: Comparison) -> Comparison:
    if not comparison.passed:
        raise VerificationError(
            f"{comparison.what}: max abs error {comparison.max_abs_error:.3g} exceeds tolerance "
            f"{comparison.atol:g} + {comparison.rtol:g} x {comparison.reference_max_abs:.3g} "
            f"(relative {comparison.max_rel_error:.3g}); nothing was written"
        )
    return comparison
