"""What the API publishes about itself: Prometheus metrics text and the OpenAPI 3 document.

Both are written by hand (no client library, no schema generator): the serve path keeps
to starlette, uvicorn, numpy and a runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from hmt.bundle import TensorSpec

if TYPE_CHECKING:
    from hmt.serve.controller import Controller


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _metric(lines: list[str], name: str, kind: str, help_text: str,
            samples: Iterable[tuple[Mapping[str, object], float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        suffix = ""
        if labels:
            suffix = "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"
        lines.append(f"{name}{suffix} {float(value):.9g}")


def prometheus_text(controller: Controller, http_counts: Mapping[tuple[str, int], int], queue_depth: int,
                    max_queue: int) -> str:
    """The text exposition format (version 0.0.4) of the controller's and the API's state."""
    lines: list[str] = []
    status = controller.status(last=0)
    latency_window, decision_window, latency_sum_ms, requests = controller.windows()
    latencies = np.array(latency_window, dtype=np.float64)
    decisions = np.array(decision_window, dtype=np.float64)
    _metric(lines, "hmt_http_responses_total", "counter", "HTTP responses by path and status code.",
            [({"path": p, "code": c}, n) for (p, c), n in sorted(http_counts.items())])
    _metric(lines, "hmt_predictions_total", "counter", "Answered predictions by variant.",
            [({"variant": v}, n) for v, n in sorted(status["per_variant"].items())])
    _metric(lines, "hmt_exits_total", "counter", "Answered predictions by the exit that answered.",
            [({"exit": e}, n) for e, n in sorted(status["per_exit"].items())])
    _metric(lines, "hmt_deadline_misses_total", "counter", "Predictions over the latency budget.",
            [({}, status["deadline_misses"])])
    quantiles = [({"quantile": str(q)}, float(np.quantile(latencies, q))) for q in (0.5, 0.95, 0.99)] \
        if latencies.size else []
    _metric(lines, "hmt_latency_ms", "summary", "Queue wait + compute per prediction (recent window).",
            quantiles)
    lines.append(f"hmt_latency_ms_sum {latency_sum_ms:.9g}")
    lines.append(f"hmt_latency_ms_count {requests}")
    if decisions.size:
        _metric(lines, "hmt_decision_time_us", "gauge", "Median optimizer + switcher time per decision (recent).",
                [({}, float(np.median(decisions)))])
    _metric(lines, "hmt_switches_total", "counter", "Variant switches since start.", [({}, status["switches"])])
    _metric(lines, "hmt_ready", "gauge", "1 when a variant is loaded and warm.", [({}, float(status["ready"]))])
    if status["variant"] is not None:
        _metric(lines, "hmt_active_variant", "gauge", "The variant serving now (value 1).",
                [({"variant": status["variant"]}, 1.0)])
    for name, key, help_text in (("hmt_load_index", "load_index", "Load index I of AdaScale eq. 2 (0..1)."),
                                 ("hmt_load_forecast", "load_forecast", "AR forecast of I for the next period."),
                                 ("hmt_latency_ratio", "latency_ratio", "r = measured / predicted latency."),
                                 ("hmt_mu", "mu", "Accuracy weight mu of CrowdHMTware eq. 3.")):
        if status[key] is not None:
            _metric(lines, name, "gauge", help_text, [({}, status[key])])
    budgets = status["budgets"]
    for name, key in (("hmt_latency_budget_ms", "latency_ms"), ("hmt_memory_budget_mb", "memory_mb")):
        if budgets[key] is not None:
            _metric(lines, name, "gauge", f"Current {key} budget.", [({}, budgets[key])])
    pool = status["pool"]
    _metric(lines, "hmt_loaded_variants", "gauge", "Variants loaded in memory.", [({}, len(pool["loaded"]))])
    _metric(lines, "hmt_variant_loads_total", "counter", "Variant loads.", [({}, pool["loads"])])
    _metric(lines, "hmt_variant_load_failures_total", "counter", "Variant loads that failed.",
            [({}, pool["load_failures"])])
    _metric(lines, "hmt_queue_depth", "gauge", "Requests admitted (queued or running).", [({}, queue_depth)])
    _metric(lines, "hmt_queue_limit", "gauge", "Admission limit; beyond it requests get 429.", [({}, max_queue)])
    _loop_metrics(lines, status)
    if status.get("adapt"):
        _adapt_metrics(lines, status["adapt"])
    return "\n".join(lines) + "\n"


def _adapt_metrics(lines: list[str], adapt: Mapping[str, Any]) -> None:
    """serve --adapt (hmt.serve.running.adapt): drift, the adapted variant, the guard and the worker's cost."""
    _metric(lines, "hmt_adapt_drifting", "gauge", "1 while the input statistics drift from the source data.",
            [({}, float(bool(adapt["drifting"])))])
    _metric(lines, "hmt_adapt_drift_score", "gauge", "Largest standardised distance of recent input statistics "
            "from the source data's.", [({}, adapt["drift_score"])])
    serving = adapt.get("serving_adapted")
    _metric(lines, "hmt_adapt_serving", "gauge", "1 while a BN-adapted variant answers requests.",
            [({"variant": serving or ""}, float(serving is not None))])
    _metric(lines, "hmt_adapt_events_total", "counter", "Adaptation events: inputs offered/dropped/observed, "
            "drift starts, adapted variants adopted/refused by the guard, resets, evictions, errors.",
            [({"event": k}, v) for k, v in sorted(adapt["counts"].items())])
    _metric(lines, "hmt_adapt_queue_depth", "gauge", "Inputs waiting for the adaptation worker.",
            [({}, adapt["queue"]["depth"])])
    _metric(lines, "hmt_adapt_worker_seconds_total", "counter", "CPU-side time the adaptation worker spent.",
            [({}, adapt["worker"]["busy_s"])])
    decision = adapt.get("last_decision") or {}
    for key in ("entropy_before", "entropy_after", "canary_accuracy_before", "canary_accuracy_after"):
        if decision.get(key) is not None:
            _metric(lines, f"hmt_adapt_guard_{key}", "gauge", f"The guard's last decision: {key.replace('_', ' ')}.",
                    [({"accepted": str(bool(decision.get("accepted"))).lower()}, decision[key])])


def _loop_metrics(lines: list[str], status: Mapping[str, Any]) -> None:
    """What the loop decides on: per-variant estimates, disagreements, integrity refusals, shadow runs."""
    estimates = status.get("estimates") or {}
    _metric(lines, "hmt_variant_latency_estimate_ms", "gauge",
            "Tail latency the loop decides on per variant: measured p95, or the prior (profile x load x r).",
            [({"variant": a, "source": e["source"]}, e["latency_ms"]) for a, e in sorted(estimates.items())])
    _metric(lines, "hmt_variant_latency_ratio", "gauge", "Measured / predicted latency per measured variant.",
            [({"variant": a}, e["ratio"]) for a, e in sorted(estimates.items()) if e["ratio"] is not None])
    _metric(lines, "hmt_prediction_disagreement", "gauge",
            "Measured / predicted ratio of variants outside [r_min, r_max]: the measurement decides.",
            [({"variant": a}, r) for a, r in sorted((status.get("prediction_disagrees") or {}).items())])
    if status.get("feasible") is not None:
        _metric(lines, "hmt_decision_feasible", "gauge", "0 when no variant meets the budgets (serving the fastest).",
                [({}, float(bool(status["feasible"])))])
    pool = status["pool"]
    _metric(lines, "hmt_variant_integrity_failures_total", "counter",
            "Variant loads refused because a file no longer matches the bundle manifest's sha256.",
            [({}, pool.get("integrity_failures", 0))])
    shadow = status.get("shadow") or {}
    _metric(lines, "hmt_shadow_runs_total", "counter", "Shadow runs measuring idle variants.",
            [({}, shadow.get("runs", 0))])
    if status.get("own_cpu_util") is not None:
        _metric(lines, "hmt_own_cpu_util", "gauge", "serve's own CPU share, left out of the load index.",
                [({}, status["own_cpu_util"])])
    if status.get("energy_budget") is not None:
        _metric(lines, "hmt_energy_budget", "gauge", "Energy budget per inference (profile unit).",
                [({}, status["energy_budget"])])


def _error_schema() -> dict[str, Any]:
    return {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Malformed body or header", 401: "Missing or wrong bearer token", 413: "Body too large",
            415: "Unsupported content type", 422: "Tensor of the wrong shape or dtype, or not finite",
            429: "Queue full; retry after the Retry-After seconds", 503: "Not ready, or shutting down",
            504: "No answer within the deadline"}
    return {str(c): {"description": text[c], "content": {"application/json": {"schema": _error_schema()}}}
            for c in codes}


def openapi_document(spec: TensorSpec, body_limit_bytes: int, auth: bool) -> dict[str, Any]:
    """OpenAPI 3.0 description of the serve API for a bundle whose input is ``spec``."""
    shape = list(spec.shape)
    auth_errors = (401,) if auth else ()
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "hmt serve", "version": "1",
                 "description": "On-device inference with runtime variant switching and early exit."},
        "paths": {
            "/v1/predict": {"post": {
                "summary": "Classify one input tensor",
                "description": (f"Input: {spec.dtype} tensor of shape {shape} (the leading batch axis of 1 may be "
                                f"omitted), at most {body_limit_bytes} bytes of body. Header X-Deadline-Ms may lower "
                                "the server's per-request deadline."),
                "parameters": [{"name": "X-Deadline-Ms", "in": "header", "required": False,
                                "schema": {"type": "number", "exclusiveMinimum": True, "minimum": 0}},
                               {"name": "X-HMT-Client-Latency-Ms", "in": "header", "required": False,
                                "description": "Latency the client saw for its previous request",
                                "schema": {"type": "number", "exclusiveMinimum": True, "minimum": 0}}],
                "requestBody": {"required": True, "content": {
                    "application/x-npy": {"schema": {"type": "string", "format": "binary"}},
                    # hmt.serve.http.inputs: .npy also as octet-stream (float tensor, uint8 pixels [H, W, C],
                    # or a batch [N, ...]); encoded images, normalised with the bundle's preprocessing.
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
                    "image/png": {"schema": {"type": "string", "format": "binary"}},
                    "application/json": {"schema": {"type": "object", "required": ["inputs"], "properties": {
                        "inputs": {"type": "array", "items": {}, "description": f"Nested list of shape {shape}"}}}},
                }},
                "responses": {"200": {"description": "The answer", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Prediction"}}}},
                    **_errors(400, *auth_errors, 413, 415, 422, 429, 503, 504)},
            }},
            "/v1/health/live": {"get": {"summary": "The process answers", "responses": {
                "200": {"description": "Live"}, **_errors(*auth_errors)}}},
            "/v1/health/ready": {"get": {"summary": "A variant is loaded and warm", "responses": {
                "200": {"description": "Ready"}, **_errors(*auth_errors, 503)}}},
            "/v1/status": {"get": {"summary": "Active variant, load index, budgets, recent decisions", "responses": {
                "200": {"description": "Status", "content": {"application/json": {"schema": {"type": "object"}}}},
                **_errors(*auth_errors)}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4)", "responses": {
                "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                **_errors(*auth_errors)}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {
                "200": {"description": "OpenAPI 3 document"}, **_errors(*auth_errors)}}},
        },
        "components": {"schemas": {
            "Prediction": {"type": "object", "required": ["class", "confidence", "exit", "variant", "latency_ms"],
                           "properties": {
                               "class": {"type": "integer", "description": "Arg-max class index"},
                               "class_name": {"type": "string", "nullable": True,
                                              "description": "The bundle's name for the class, if it has names"},
                               "confidence": {"type": "number", "description": "Softmax probability of the class"},
                               "exit": {"type": "integer", "description": "Segment whose exit head answered"},
                               "variant": {"type": "string", "description": "Arch id of the variant that answered"},
                               "latency_ms": {"type": "number", "description": "Server queue wait + compute"},
                               "compute_ms": {"type": "number", "description": "Compute of the chain alone"},
                               "over_budget": {"type": "boolean", "description": "latency_ms over the budget"}}},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
        }},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
