"""/metrics by Prometheus conventions: the client library's parser and promtool accept it, histograms
in seconds, the counters and gauges the issue names, process metrics, one registry per server."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_bundles import FAST_SWITCH, npy_bytes

from hmt.bundle import load_bundle
from hmt.runtime.settings import ServeSettings
from hmt.serve.controller import Controller
from hmt.serve.http.api import ApiOptions, create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

NPY = {"content-type": "application/x-npy"}


def scrape(bundle_dir: Path, requests: int) -> str:
    controller = Controller(load_bundle(bundle_dir), ServeSettings.from_mapping(FAST_SWITCH), warmup_runs=1)
    controller.start(background=False)
    with TestClient(create_app(controller, ApiOptions(model_name="m"))) as client:
        for i in range(requests):
            assert client.post("/v1/predict", content=npy_bytes(np.array([[i % 4, 0, 0, 0]], np.float32)),
                               headers=NPY).status_code == 200
        body = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 9, 0, 0]}]}
        assert client.post("/v2/models/m/infer", json=body).status_code == 200
        assert client.get("/v2/models/other").status_code == 404
        controller.tick()  # one decision observed into the histogram
        response = client.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        return response.text


def test_metrics_parse_with_the_client_library(bundle_dir: Path) -> None:
    text = scrape(bundle_dir, 3)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("hmt_request_duration_seconds", "hmt_inference_duration_seconds", "hmt_decision_duration_seconds"):
        assert families[name].type == "histogram"
    for name in ("hmt_requests", "hmt_deadline_misses", "hmt_variant_switches", "hmt_variant_load_failures",
                 "hmt_http_requests", "process_cpu_seconds"):
        assert families[name].type == "counter", name
    for name in ("hmt_running_variant", "hmt_load_index", "hmt_queue_depth", "process_resident_memory_bytes"):
        assert families[name].type == "gauge", name

    def sample(family: str, sample_name: str, **labels: str) -> float:
        for s in families[family].samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise AssertionError(f"no {sample_name} {labels}")

    assert sample("hmt_requests", "hmt_requests_total") == 4  # 3 on v1, 1 on v2
    assert sample("hmt_request_duration_seconds", "hmt_request_duration_seconds_count", protocol="v1") == 3
    assert sample("hmt_request_duration_seconds", "hmt_request_duration_seconds_count", protocol="v2") == 1
    assert sample("hmt_inference_duration_seconds", "hmt_inference_duration_seconds_count") == 4
    assert sample("hmt_decision_duration_seconds", "hmt_decision_duration_seconds_count") >= 1
    assert 0 < sample("hmt_inference_duration_seconds", "hmt_inference_duration_seconds_sum") < 4.0  # seconds
    assert sample("hmt_running_variant", "hmt_running_variant", variant="big") == 1
    assert sample("hmt_http_requests", "hmt_http_requests_total", path="/v2/models/{model}/infer", code="200") == 1
    assert sample("hmt_http_requests", "hmt_http_requests_total", path="/v2/models/{model}", code="404") == 1


def test_each_server_has_its_own_registry(bundle_dir: Path) -> None:
    first, second = scrape(bundle_dir, 2), scrape(bundle_dir, 5)
    counts = []
    for text in (first, second):
        family = next(f for f in text_string_to_metric_families(text) if f.name == "hmt_inference_duration_seconds")
        counts.append(next(s.value for s in family.samples if s.name.endswith("_count")))
    assert counts == [3, 6]  # no global state carried from one server to the next


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_accepts_the_metrics(bundle_dir: Path) -> None:
    text = scrape(bundle_dir, 2)
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr  # no lint warnings


def test_grafana_dashboard_queries_metrics_that_exist(bundle_dir: Path) -> None:
    import json
    import re

    path = Path(__file__).parents[2] / "scripts" / "device" / "grafana" / "hmt-serve.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b((?:hmt|process)_[a-z_]+)\b", e)}
    exposed = {s.name for f in text_string_to_metric_families(scrape(bundle_dir, 1)) for s in f.samples}
    exposed.add("hmt_latency_budget_seconds")  # only with a latency budget (this bundle has none)
    assert used and used <= exposed, sorted(used - exposed)
