"""Cumulative inference statistics in the shape of Triton's statistics extension
(``GET /v2/models[/{model}[/versions/1]]/stats``, :mod:`hmt.serve.http.oip`; what tritonclient's
``get_inference_statistics`` reads).

Every request that reached the inference queue counts, on either protocol: a success with its
span from the first byte in to the answer, a failure (refused when the queue is full, past its
deadline, an input the model cannot take) with the same span. ``queue`` and ``compute_infer``
count requests, as Triton's do (a dashboard's ns / count is the wait and the compute of one
request), summing the queue wait and the compute time of the request's inputs;
``inference_count`` counts inputs. The bundle's graphs take one input at a time, so each input
is one execution (``execution_count``, ``batch_stats`` of batch size 1, counted per execution);
the dynamic batcher's shared runs are not told apart. Decoding and encoding are not timed apart from the span
(``compute_input`` and ``compute_output`` stay at zero).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from hmt.serve.reporting.records import Prediction

_NS_PER_MS = 1_000_000


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


class InferenceStats:
    """Thread-safe running totals since the server started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.success_count = 0
        self.success_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        self.inference_count = 0  # inputs answered
        self.queue_ns = 0
        self.compute_ns = 0
        self.last_inference_ms = 0  # wall clock of the last answer, ms since the epoch (0: none yet)

    def answered(self, predictions: Sequence[Prediction], span_s: float) -> None:
        """One request answered, ``span_s`` after its first byte."""
        queue_ns = sum(int(max(0.0, p.latency_ms - p.compute_ms) * _NS_PER_MS) for p in predictions)
        compute_ns = sum(int(p.compute_ms * _NS_PER_MS) for p in predictions)
        with self._lock:
            self.success_count += 1
            self.success_ns += int(max(0.0, span_s) * 1e9)
            self.inference_count += len(predictions)
            self.queue_ns += queue_ns
            self.compute_ns += compute_ns
            self.last_inference_ms = int(time.time() * 1e3)

    def failed(self, span_s: float) -> None:
        """One request admitted (or refused by a full queue) that got no answer."""
        with self._lock:
            self.fail_count += 1
            self.fail_ns += int(max(0.0, span_s) * 1e9)

    def model_stat(self, name: str, version: str) -> dict[str, Any]:
        """One ``$model_stat`` of the statistics extension."""
        with self._lock:
            count, compute_ns, queue_ns = self.inference_count, self.compute_ns, self.queue_ns
            requests = self.success_count
            success = _duration(self.success_count, self.success_ns)
            fail = _duration(self.fail_count, self.fail_ns)
            last_ms = self.last_inference_ms
        none = _duration(0, 0)
        batches = [{"batch_size": 1, "compute_input": none, "compute_infer": _duration(count, compute_ns),
                    "compute_output": none}] if count else []
        return {
            "name": name, "version": version, "last_inference": last_ms,
            "inference_count": count, "execution_count": count,
            "inference_stats": {"success": success, "fail": fail, "queue": _duration(requests, queue_ns),
                                "compute_input": none, "compute_infer": _duration(requests, compute_ns),
                                "compute_output": none, "cache_hit": none, "cache_miss": none},
            "batch_stats": batches,
        }
