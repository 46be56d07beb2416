"""What an answer carries beyond the class: probabilities and the top k classes, on request.

Both protocols ask the same way in spirit: ``/v1/predict?top_k=5&probabilities=true`` (or the
fields ``top_k`` / ``probabilities`` of a JSON or multipart body), and on ``/v2`` the request
parameter ``top_k`` or the ``probabilities`` output (:mod:`hmt.serve.http.oip`). A parameter that
is not understood is refused (400), never ignored. The probabilities are the softmax of the
exit head that answered (the same numbers ``confidence`` is the largest of).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hmt.serve.http.inputs import ApiError
from hmt.serve.reporting.records import Prediction

QUERY_KEYS = ("top_k", "probabilities")
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


@dataclass(frozen=True)
class AnswerOptions:
    top_k: int | None = None  # the k most probable classes, most probable first
    probabilities: bool = False  # every class's probability

    @property
    def wants_probabilities(self) -> bool:
        return self.probabilities or self.top_k is not None


def parse_top_k(value: object, classes: int, where: str) -> int:
    """``value`` as an integer in ``1..classes``; 400 naming ``where`` otherwise."""
    if isinstance(value, bool):
        raise ApiError(400, "bad_top_k", f"{where} must be an integer in 1..{classes}, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise ApiError(400, "bad_top_k", f"{where} must be an integer in 1..{classes}, got {text[:20]!r}")
        value = int(text)
    # JSON numbers (v1's parser reads them as floats); float.is_integer, not 3.12's int.is_integer
    if isinstance(value, float) and value.is_integer():  # novermin
        value = int(value)
    if not isinstance(value, int) or not 1 <= value <= classes:
        raise ApiError(400, "bad_top_k", f"{where} must be an integer in 1..{classes}, got {str(value)[:20]}")
    return value


def parse_flag(value: object, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ApiError(400, "bad_parameter", f"{where} must be true or false, got {str(value)[:20]!r}")


def answer_options(query: Mapping[str, str], body_fields: Mapping[str, Any], classes: int) -> AnswerOptions:
    """The options of a ``/v1/predict`` request: query parameters, then the body's fields (which win)."""
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        raise ApiError(400, "unknown_parameter", f"query parameter(s) {unknown} are not understood; "
                                                 f"expected some of {list(QUERY_KEYS)}")
    merged: dict[str, Any] = {**query, **body_fields}
    top_k = None if merged.get("top_k") is None else parse_top_k(merged["top_k"], classes, "top_k")
    probabilities = False if merged.get("probabilities") is None else parse_flag(merged["probabilities"],
                                                                                "probabilities")
    return AnswerOptions(top_k, probabilities)


def probabilities_of(p: Prediction) -> np.ndarray:
    if p.probabilities is None:
        raise ApiError(422, "probabilities_unavailable", f"variant {p.variant!r} answers without class "
                                                         "probabilities (an offloaded answer); ask without "
                                                         "top_k/probabilities")
    return np.asarray(p.probabilities, dtype=np.float32)


def top_k_of(probabilities: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest probabilities, largest first (ties: lower index first)."""
    order = np.argsort(-probabilities, kind="stable")
    return order[:k]


def class_name(names: Sequence[str] | None, index: int) -> str | None:
    return names[index] if names and 0 <= index < len(names) else None


def prediction_json(p: Prediction, names: Sequence[str] | None, options: AnswerOptions) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "class": p.class_index,
        "class_name": class_name(names, p.class_index),
        "confidence": p.confidence,
        "exit": p.exit,
        "variant": p.variant,
        "latency_ms": p.latency_ms,
        "compute_ms": p.compute_ms,
        "over_budget": p.deadline_miss,
    }
    if options.wants_probabilities:
        probs = probabilities_of(p)
        if options.probabilities:
            doc["probabilities"] = [float(v) for v in probs]
        if options.top_k is not None:
            doc["top_k"] = [{"class": int(i), "class_name": class_name(names, int(i)), "probability": float(probs[i])}
                            for i in top_k_of(probs, options.top_k)]
    return doc
