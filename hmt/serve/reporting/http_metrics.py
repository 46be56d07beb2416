"""What the HTTP face adds to ``/metrics`` and ``/v1/status``: connection counts and recent
request spans and client-reported latencies, as Prometheus text."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

from hmt.serve.http.connections import ConnectionStats

WINDOW = 2048  # recent values a LatencyWindow keeps


class LatencyWindow:
    """Recent values (ms) and their running count/sum, thread-safe, for status and metrics."""

    def __init__(self, size: int = WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._lock = threading.Lock()
        self.count = 0
        self.sum_ms = 0.0

    def add(self, value_ms: float) -> None:
        with self._lock:
            self._values.append(value_ms)
            self.count += 1
            self.sum_ms += value_ms

    def summary(self) -> dict[str, float] | None:
        with self._lock:
            values = np.array(self._values, dtype=np.float64)
            count, total = self.count, self.sum_ms
        if not values.size:
            return None
        return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
                "p99": float(np.percentile(values, 99)), "count": count, "sum": total}


def http_metrics(stats: ConnectionStats, spans: LatencyWindow, client: LatencyWindow) -> str:
    """Prometheus lines of the HTTP and connection layers (appended to the controller's)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            suffix = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
            lines.append(f"{name}{suffix} {float(value):.9g}")

    metric("hmt_connections_open", "gauge", "Open HTTP connections.", [({}, stats.open)])
    metric("hmt_connections_max", "gauge", "Connection cap (accept time).", [({}, stats.max_connections)])
    metric("hmt_connection_events_total", "counter",
           "Connections accepted, evicted for a new one, refused at the cap, cut at the receipt deadline or "
           "at shutdown, and accept() failures.",
           [({"event": e}, getattr(stats, f)) for e, f in (
               ("accepted", "accepted"), ("evicted", "evicted"), ("refused_full", "refused_full"),
               ("receipt_timeout", "receipt_timeouts"), ("shutdown_cut", "shutdown_cut"),
               ("accept_error", "accept_errors"))])
    for name, window, help_text in (
            ("hmt_request_span_ms", spans, "Whole server-side span of answered predictions, first byte in to "
                                           "last byte out (recent window)."),
            ("hmt_client_latency_ms", client, "Latency clients reported for their previous request "
                                              "(X-HMT-Client-Latency-Ms, recent window).")):
        summary = window.summary()
        quantiles = [({"quantile": q}, summary[k]) for q, k in (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"))] \
            if summary else []
        metric(name, "summary", help_text, quantiles)
        lines.append(f"{name}_sum {window.sum_ms:.9g}")
        lines.append(f"{name}_count {window.count}")
    return "\n".join(lines) + "\n"
