"""What the API publishes about itself: the OpenAPI 3 document of ``/v1`` and of the Open Inference
Protocol routes under ``/v2`` (:mod:`hmt.serve.http.oip`; their bodies are the protocol's own, so
the document names them and links the protocol rather than restating it), written by hand, no schema
generator. ``/metrics`` is :mod:`hmt.serve.reporting.metrics`."""

from __future__ import annotations

from typing import Any

from hmt.bundle import TensorSpec


def _error_schema() -> dict[str, Any]:
    return {"$ref": "#/components/schemas/Error"}


_ERROR_TEXT = {400: "Malformed body or header", 401: "Missing or wrong bearer token", 404: "Unknown model or version",
               413: "Body too large", 415: "Unsupported content type",
               422: "Tensor of the wrong shape or dtype, or not finite",
               429: "Queue full; retry after the Retry-After seconds", 503: "Not ready, or shutting down",
               504: "No answer within the deadline"}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": _ERROR_TEXT[c], "content": {"application/json": {"schema": _error_schema()}}}
            for c in codes}


def _predict_path(spec: TensorSpec, body_limit_bytes: int, auth_errors: tuple[int, ...]) -> dict[str, Any]:
    """The OpenAPI item of POST /v1/predict."""
    shape = list(spec.shape)
    return {"post": {
        "summary": "Classify one input tensor",
        "description": (f"Input: {spec.dtype} tensor of shape {shape} (the leading batch axis of 1 may be "
                        f"omitted), at most {body_limit_bytes} bytes of body. Header X-Deadline-Ms may lower "
                        "the server's per-request deadline."),
        "parameters": [{"name": "X-Deadline-Ms", "in": "header", "required": False,
                        "schema": {"type": "number", "exclusiveMinimum": True, "minimum": 0}},
                       {"name": "X-HMT-Client-Latency-Ms", "in": "header", "required": False,
                        "description": "Latency the client saw for its previous request",
                        "schema": {"type": "number", "exclusiveMinimum": True, "minimum": 0}},
                       {"name": "top_k", "in": "query", "required": False,
                        "description": "Also answer the k most probable classes (also a body field)",
                        "schema": {"type": "integer", "minimum": 1}},
                       {"name": "probabilities", "in": "query", "required": False,
                        "description": "Also answer every class's probability (also a body field)",
                        "schema": {"type": "boolean"}}],
        "requestBody": {"required": True, "content": {
            "application/x-npy": {"schema": {"type": "string", "format": "binary"}},
            # hmt.serve.http.inputs: .npy also as octet-stream (float tensor, uint8 pixels [H, W, C],
            # or a batch [N, ...]); encoded images, normalised with the bundle's preprocessing.
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            # hmt.serve.http.bodies: each file part one input (JPEG, PNG, .npy or raw uint8 pixels);
            # fields top_k / probabilities.
            "multipart/form-data": {"schema": {"type": "object", "properties": {
                "file": {"type": "string", "format": "binary"}, "top_k": {"type": "integer"},
                "probabilities": {"type": "boolean"}}}},
            "application/json": {"schema": {"type": "object", "required": ["inputs"], "properties": {
                "inputs": {"type": "array", "items": {}, "description": f"Nested list of shape {shape}"}}}},
        }},
        "responses": {"200": {"description": "The answer", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/Prediction"}}}},
            **_errors(400, *auth_errors, 413, 415, 422, 429, 503, 504)},
    }}


OIP_URL = "https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/"


def _v2_paths(auth_errors: tuple[int, ...]) -> dict[str, Any]:
    """The OpenAPI items of the Open Inference Protocol routes (errors in the protocol's shape)."""
    def errors(*codes: int) -> dict[str, Any]:
        return {str(c): {"description": _ERROR_TEXT[c], "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/V2Error"}}}} for c in codes}

    def get(summary: str, *codes: int) -> dict[str, Any]:
        return {"get": {"summary": summary, "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            **errors(*auth_errors, *codes)}}}

    model = [{"name": "model_name", "in": "path", "required": True, "schema": {"type": "string"}}]
    versioned = [*model, {"name": "model_version", "in": "path", "required": True,
                          "schema": {"type": "string", "enum": ["1"]}}]
    infer = {"post": {
        "summary": "Infer (Open Inference Protocol; JSON tensors, or the binary-data extension)",
        "description": f"The protocol's inference request and response: {OIP_URL}. BYTES inputs are encoded "
                       "images or raw bytes, decoded with the bundle's preprocessing. Binary data: "
                       "application/octet-stream with header Inference-Header-Content-Length.",
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"type": "object", "required": ["inputs"]}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
        "responses": {"200": {"description": "The inference response", "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
            **errors(400, *auth_errors, 404, 413, 415, 422, 429, 503, 504)}}}
    paths: dict[str, Any] = {
        "/v2": get("Server metadata (name, version, extensions)"),
        "/v2/health/live": get("The process answers"),
        "/v2/health/ready": get("A variant is loaded and warm", 503),
        "/v2/models/stats": get("Inference statistics of every model (Triton's statistics extension)"),
    }
    for base, params in (("/v2/models/{model_name}", model),
                         ("/v2/models/{model_name}/versions/{model_version}", versioned)):
        for suffix, item in (("", get("Model metadata: inputs and outputs, variants and the running one", 404)),
                             ("/ready", get("The model is ready", 404, 503)),
                             ("/config", get("The model's configuration (Triton's model configuration)", 404)),
                             ("/stats", get("The model's inference statistics", 404)),
                             ("/infer", infer)):
            method = next(iter(item))
            paths[base + suffix] = {method: {**item[method], "parameters": params}}
    return paths


def _schemas() -> dict[str, Any]:
    """The response schemas (a new dict each call: the document is the caller's to change)."""
    return {
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
                           "over_budget": {"type": "boolean", "description": "latency_ms over the budget"},
                           "probabilities": {"type": "array", "items": {"type": "number"},
                                             "description": "Softmax per class (?probabilities=true)"},
                           "top_k": {"type": "array", "description": "The k most probable (?top_k=k)",
                                     "items": {"type": "object", "properties": {
                                         "class": {"type": "integer"}, "probability": {"type": "number"},
                                         "class_name": {"type": "string", "nullable": True}}}}}},
        "V2Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}},
                    "description": "The Open Inference Protocol's error body"},
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
    }


def openapi_document(spec: TensorSpec, body_limit_bytes: int, auth: bool) -> dict[str, Any]:
    """OpenAPI 3.0 description of the serve API for a bundle whose input is ``spec``."""
    auth_errors = (401,) if auth else ()
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "hmt serve", "version": "1",
                 "description": "On-device inference with runtime variant switching and early exit."},
        "paths": {
            "/v1/predict": _predict_path(spec, body_limit_bytes, auth_errors),
            "/v1/health/live": {"get": {"summary": "The process answers", "responses": {
                "200": {"description": "Live"}, **_errors(*auth_errors)}}},
            "/v1/health/ready": {"get": {"summary": "A variant is loaded and warm", "responses": {
                "200": {"description": "Ready"}, **_errors(*auth_errors, 503)}}},
            "/v1/status": {"get": {"summary": "Active variant, load index, budgets, recent decisions", "responses": {
                "200": {"description": "Status", "content": {"application/json": {"schema": {"type": "object"}}}},
                **_errors(*auth_errors)}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format 0.0.4; hmt.serve.reporting.metrics)",
                                 "responses": {
                "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                **_errors(*auth_errors)}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {
                "200": {"description": "OpenAPI 3 document"}, **_errors(*auth_errors)}}},
            **_v2_paths(auth_errors),
        },
        "components": {"schemas": _schemas()},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
