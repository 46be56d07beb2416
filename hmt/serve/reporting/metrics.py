"""``/metrics`` by Prometheus conventions, through the official client library (``prometheus_client``).

Every server has its own :class:`~prometheus_client.CollectorRegistry` (no global state: two
servers in one process, as in the tests, never mix). Base units (seconds, bytes), ``_total`` on
counters, histograms where a fleet needs to aggregate:

- ``hmt_request_duration_seconds{protocol}``: an answered prediction's whole server-side span
  (first byte in to last byte out), ``v1`` or ``v2``;
- ``hmt_inference_duration_seconds``: queue wait + compute per prediction (what the budget counts);
- ``hmt_decision_duration_seconds``: the loop's optimizer + switcher time per decision;
- ``hmt_client_reported_latency_seconds``: what clients saw for their previous request
  (header ``X-HMT-Client-Latency-Ms``; only reports plausible for the connection's previous
  answer, :mod:`hmt.serve.http.client_reports`; ``hmt_client_latency_reports_total{outcome}``
  counts those accepted and refused).

Counters and gauges are read from the controller when scraped (:class:`StatusCollector`): requests
by path and code, predictions by variant and exit, deadline misses, switches, loads and failed
loads, the running variant, load index, budgets, queue and connections, serve --adapt's state,
serve --peer's (``hmt_offload_*``: answers by where they were computed, the peer's failures by
reason, whether the peer is usable now, the measured link);
``process_*`` and ``python_*`` come from the library's process and platform collectors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from hmt.serve.http.connections import ConnectionStats
from hmt.serve.reporting.records import Prediction

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Edge inference spans sub-millisecond engines to a second under load.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1)
_CONNECTION_EVENTS = (("accepted", "accepted"), ("evicted", "evicted"), ("refused_full", "refused_full"),
                      ("receipt_timeout", "receipt_timeouts"), ("shutdown_cut", "shutdown_cut"),
                      ("accept_error", "accept_errors"))


def _gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        yield GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(name, doc, value=float(value))


def _labelled(kind: type[Any], name: str, doc: str, labels: list[str],
              samples: list[tuple[list[str], float]]) -> Metric:
    family = kind(name, doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, float(value))
    return family


class StatusCollector(Collector):
    """Counters and gauges read from the controller (and the HTTP layer) at each scrape."""

    def __init__(self, controller: Any, http_counts: Mapping[tuple[str, int], int] | None = None,
                 queue: Callable[[], Mapping[str, int]] | None = None,
                 connections: ConnectionStats | None = None, client_reports: Any = None) -> None:
        self.controller = controller
        self.http_counts = http_counts
        self.queue = queue
        self.connections = connections
        self.client_reports = client_reports  # hmt.serve.http.client_reports.ClientReports

    def collect(self) -> Iterator[Metric]:
        status = self.controller.status(last=0)
        yield from self._loop(status)
        yield from self._variants(status)
        if self.http_counts is not None:
            counts = sorted(dict(self.http_counts).items())
            yield _labelled(CounterMetricFamily, "hmt_http_requests", "HTTP requests answered, by route and status.",
                            ["path", "code"], [([p, str(c)], n) for (p, c), n in counts])
        if self.queue is not None:
            q = self.queue()
            yield GaugeMetricFamily("hmt_queue_depth", "Requests admitted (queued or running).", value=q["admitted"])
            yield GaugeMetricFamily("hmt_queue_limit", "Admission limit; beyond it requests get 429.",
                                    value=q["max_queue"])
            yield _labelled(CounterMetricFamily, "hmt_queue_rejections", "Requests refused at admission (full) or "
                            "dropped at their deadline.", ["reason"],
                            [(["full"], q["rejected_full"]), (["deadline"], q["deadline_expired"])])
        if self.connections is not None:
            stats = self.connections
            yield GaugeMetricFamily("hmt_connections_open", "Open HTTP connections.", value=stats.open)
            yield GaugeMetricFamily("hmt_connections_max", "Connection cap (set at start).",
                                    value=stats.max_connections)
            yield _labelled(CounterMetricFamily, "hmt_connection_events", "Connections accepted, evicted for a new "
                            "one, refused at the cap, cut at the receipt deadline or at shutdown, accept() failures.",
                            ["event"], [([e], getattr(stats, f)) for e, f in _CONNECTION_EVENTS])
        if self.client_reports is not None:
            reports = self.client_reports
            yield _labelled(CounterMetricFamily, "hmt_client_latency_reports", "X-HMT-Client-Latency-Ms reports, "
                            "accepted (plausible for the connection's previous answer) or refused.", ["outcome"],
                            [(["accepted"], reports.accepted), (["refused"], reports.refused)])
        if status.get("adapt"):
            yield from _adapt(status["adapt"])
        if status.get("offload"):
            yield from _offload(status["offload"])
        if status.get("blocks"):
            yield from _blocks(status["blocks"])
        if status.get("research"):
            yield from _research(status["research"])

    def _loop(self, status: Mapping[str, Any]) -> Iterator[Metric]:
        yield _counter("hmt_requests", "Predictions answered.", status["requests"])
        yield _counter("hmt_deadline_misses", "Predictions over the latency budget.", status["deadline_misses"])
        yield _counter("hmt_variant_switches", "Variant switches since start.", status["switches"])
        yield GaugeMetricFamily("hmt_ready", "1 when a variant is loaded and warm.", value=float(status["ready"]))
        running = status["variant"]
        yield _labelled(GaugeMetricFamily, "hmt_running_variant", "The variant serving now (value 1).",
                        ["variant"], [([running], 1.0)] if running is not None else [])
        yield from _gauge("hmt_load_index", "Load index I of AdaScale eq. 2 (0..1), outside serve's own CPU time.",
                          status["load_index"])
        yield from _gauge("hmt_load_forecast", "AR forecast of the load index for the next period.",
                          status["load_forecast"])
        yield from _gauge("hmt_latency_ratio", "r = measured / predicted latency of the running variant.",
                          status["latency_ratio"])
        yield from _gauge("hmt_mu", "Accuracy weight mu of CrowdHMTware eq. 3.", status["mu"])
        budgets = status["budgets"]
        yield from _gauge("hmt_latency_budget_seconds", "Latency budget per request (queue + compute).",
                          None if budgets["latency_ms"] is None else budgets["latency_ms"] / 1e3)
        yield from _gauge("hmt_memory_budget_bytes", "Memory budget of the loaded variants.",
                          None if budgets["memory_mb"] is None else budgets["memory_mb"] * 1e6)
        yield from _gauge("hmt_energy_budget", "Energy budget per inference, in the device profile's energy unit.",
                          status.get("energy_budget"))
        if status.get("feasible") is not None:
            yield GaugeMetricFamily("hmt_decision_feasible", "0 when no variant meets the budgets (serving the "
                                    "fastest).", value=float(bool(status["feasible"])))
        yield from _gauge("hmt_own_cpu_ratio", "serve's own share of the CPU, left out of the load index.",
                          status.get("own_cpu_util"))
        yield _labelled(CounterMetricFamily, "hmt_predictions", "Predictions answered, by variant.", ["variant"],
                        [([v], n) for v, n in sorted(status["per_variant"].items())])
        yield _labelled(CounterMetricFamily, "hmt_exits", "Predictions answered, by the exit that answered.",
                        ["exit"], [([str(e)], n) for e, n in sorted(status["per_exit"].items())])
        shadow = status.get("shadow") or {}
        yield _counter("hmt_shadow_runs", "Shadow runs measuring idle variants.", shadow.get("runs", 0))

    def _variants(self, status: Mapping[str, Any]) -> Iterator[Metric]:
        pool = status["pool"]
        yield GaugeMetricFamily("hmt_loaded_variants", "Variants loaded in memory.", value=len(pool["loaded"]))
        yield _counter("hmt_variant_loads", "Variant loads.", pool["loads"])
        yield _counter("hmt_variant_load_failures", "Variant loads that failed.", pool["load_failures"])
        yield _counter("hmt_variant_integrity_failures", "Variant loads refused because a file no longer matches "
                       "the bundle manifest's sha256.", pool.get("integrity_failures", 0))
        loop = status.get("control_loop") or {}
        yield GaugeMetricFamily("hmt_control_loop_alive", "1 while the decision thread runs (0: the variant is "
                                "no longer chosen by the loop).", value=float(bool(loop.get("alive"))))
        yield _counter("hmt_control_loop_unexpected_errors", "Decisions or shadow runs that raised a bug (not an "
                       "hmt error); the loop outlived them.", loop.get("unexpected_errors", 0))
        estimates = status.get("estimates") or {}
        yield _labelled(GaugeMetricFamily, "hmt_variant_latency_estimate_seconds", "Tail latency the loop decides "
                        "on per variant: measured p95, or the prior (profile x load x r).", ["variant", "source"],
                        [([a, e["source"]], e["latency_ms"] / 1e3) for a, e in sorted(estimates.items())])
        yield _labelled(GaugeMetricFamily, "hmt_variant_latency_ratio", "Measured / predicted latency per measured "
                        "variant.", ["variant"],
                        [([a], e["ratio"]) for a, e in sorted(estimates.items()) if e["ratio"] is not None])
        yield _labelled(GaugeMetricFamily, "hmt_prediction_disagreement", "Measured / predicted ratio of variants "
                        "outside [r_min, r_max]: the measurement decides.", ["variant"],
                        [([a], r) for a, r in sorted((status.get("prediction_disagrees") or {}).items())])


def _offload(offload: Mapping[str, Any]) -> Iterator[Metric]:
    """serve --peer (hmt.offload.device): where answers came from, the peer's failures, the breaker, the link."""
    yield _labelled(CounterMetricFamily, "hmt_offload_answers", "Predictions by where they were computed: local, "
                    "peer, fallback (the peer failed, the device finished the tail) or device_exit.", ["where"],
                    [([w], n) for w, n in sorted(offload["answered"].items())])
    yield _labelled(CounterMetricFamily, "hmt_offload_peer_errors", "Failed exchanges with the peer by reason "
                    "(probe_ for status and bandwidth probes).", ["reason"],
                    [([r], n) for r, n in sorted(offload["peer_errors"].items())])
    breaker = offload["breaker"]
    yield GaugeMetricFamily("hmt_offload_peer_usable", "1 while the peer's circuit breaker is closed (routes may "
                            "offload), 0 while it is open or half-open.", value=float(breaker["state"] == "closed"))
    yield _counter("hmt_offload_breaker_opens", "Times the peer's circuit breaker opened.", breaker["opens"])
    link = offload["link"]
    yield GaugeMetricFamily("hmt_offload_link_rtt_seconds", "Measured round-trip time to the peer.",
                            value=link["rtt_ms"] / 1e3)
    yield GaugeMetricFamily("hmt_offload_link_bandwidth_bits_per_second", "Measured bandwidth to the peer.",
                            value=link["bandwidth_mbit_s"] * 1e6)


def _blocks(blocks: Mapping[str, Any]) -> Iterator[Metric]:
    """serve --blocks (hmt.serve.running.blocks): the shared block graphs the pool holds."""
    yield GaugeMetricFamily("hmt_blocks_loaded", "Shared block graphs loaded (each once, however many variants "
                            "use it).", value=blocks["units_loaded"])
    yield GaugeMetricFamily("hmt_blocks_shipped", "Shared block graphs in the bundle.", value=blocks["units_shipped"])
    yield GaugeMetricFamily("hmt_blocks_resident_bytes", "Weights of the loaded block graphs.",
                            value=blocks["blocks_mb"] * 1e6)
    yield _labelled(CounterMetricFamily, "hmt_block_loads", "Block graph loads and unloads by the pool.", ["event"],
                    [(["load"], blocks["unit_loads"]), (["unload"], blocks["unit_unloads"])])


def _research(research: Mapping[str, Any]) -> Iterator[Metric]:
    """serve --research (hmt.serve.deciding.research): searches run and variants found."""
    yield _counter("hmt_research_searches", "On-device searches started (nothing fitted the budgets).",
                   research["searches"])
    yield _counter("hmt_research_found", "Searches that found a variant and handed it to the pool.",
                   research["found_count"])
    yield GaugeMetricFamily("hmt_research_running", "1 while a search runs.", value=float(bool(research["running"])))


def _adapt(adapt: Mapping[str, Any]) -> Iterator[Metric]:
    """serve --adapt (hmt.serve.running.adapt): drift, the adapted variant, the guard and the worker's cost."""
    yield GaugeMetricFamily("hmt_adapt_drifting", "1 while the input statistics drift from the source data.",
                            value=float(bool(adapt["drifting"])))
    yield GaugeMetricFamily("hmt_adapt_drift_score", "Largest standardised distance of recent input statistics "
                            "from the source data's.", value=adapt["drift_score"])
    serving = adapt.get("serving_adapted")
    yield _labelled(GaugeMetricFamily, "hmt_adapt_serving", "1 while a BN-adapted variant answers requests.",
                    ["variant"], [([serving or ""], float(serving is not None))])
    yield _labelled(CounterMetricFamily, "hmt_adapt_events", "Adaptation events: inputs offered/dropped/observed, "
                    "drift starts, adapted variants adopted/refused by the guard, resets, evictions, errors.",
                    ["event"], [([k], v) for k, v in sorted(adapt["counts"].items())])
    yield GaugeMetricFamily("hmt_adapt_queue_depth", "Inputs waiting for the adaptation worker.",
                            value=adapt["queue"]["depth"])
    yield _counter("hmt_adapt_worker_seconds", "Time the adaptation worker spent.", adapt["worker"]["busy_s"])
    decision = adapt.get("last_decision") or {}
    for key in ("entropy_before", "entropy_after", "canary_accuracy_before", "canary_accuracy_after"):
        if decision.get(key) is not None:
            yield _labelled(GaugeMetricFamily, f"hmt_adapt_guard_{key}", f"The guard's last decision: "
                            f"{key.replace('_', ' ')}.", ["accepted"],
                            [([str(bool(decision.get("accepted"))).lower()], decision[key])])


class ServeMetrics:
    """One server's registry: the histograms it observes into, the status collector, process metrics."""

    def __init__(self, controller: Any, *, http_counts: Mapping[tuple[str, int], int] | None = None,
                 queue: Callable[[], Mapping[str, int]] | None = None, connections: ConnectionStats | None = None,
                 client_reports: Any = None, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.request_duration = Histogram("hmt_request_duration_seconds", "Whole server-side span of answered "
                                          "predictions, first byte in to last byte out.", ["protocol"],
                                          buckets=LATENCY_BUCKETS_S, registry=registry)
        self.inference_duration = Histogram("hmt_inference_duration_seconds", "Queue wait + compute per "
                                            "prediction (what the latency budget counts).",
                                            buckets=LATENCY_BUCKETS_S, registry=registry)
        self.decision_duration = Histogram("hmt_decision_duration_seconds", "Optimizer + switcher time per "
                                           "decision of the adaptation loop.", buckets=DECISION_BUCKETS_S,
                                           registry=registry)
        self.client_latency = Histogram("hmt_client_reported_latency_seconds", "Latency clients reported for "
                                        "their previous request (X-HMT-Client-Latency-Ms).",
                                        buckets=LATENCY_BUCKETS_S, registry=registry)
        self.status = StatusCollector(controller, http_counts, queue, connections, client_reports)
        registry.register(self.status)
        if process:
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        observers = getattr(controller, "decision_observers", None)
        if isinstance(observers, list):
            observers.append(self.observe_decision)

    def observe_decision(self, decision_s: float) -> None:
        self.decision_duration.observe(decision_s)

    def observe_predictions(self, predictions: list[Prediction]) -> None:
        for p in predictions:
            self.inference_duration.observe(p.latency_ms / 1e3)

    def observe_request(self, protocol: str, span_ms: float, client_ms: float | None) -> None:
        self.request_duration.labels(protocol).observe(span_ms / 1e3)
        if client_ms is not None:
            self.client_latency.observe(client_ms / 1e3)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def controller_metrics_text(controller: Any) -> str:
    """The controller's counters and gauges alone, as exposition text (tests, scripts)."""
    registry = CollectorRegistry()
    registry.register(StatusCollector(controller))
    return generate_latest(registry).decode()
