"""/metrics under serve --peer: where answers came from and whether the peer is usable."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import INPUT_SHAPE

from hmt.deploy.offload import OffloadBundles
from hmt.offload.session import PeerLink, open_device
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.running.session import SessionOptions


def test_metrics_say_the_peer_is_down_and_the_device_answers_itself(offload_bundles: OffloadBundles) -> None:
    # Nothing listens on port 9: every probe is refused and every answer is local.
    wrapped = open_device(offload_bundles.device, SessionOptions(latency_ms=500.0), PeerLink("http://127.0.0.1:9"),
                          deadline_ms=2000.0)
    app = create_app(wrapped, ApiOptions(), on_shutdown=wrapped.stop)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    with TestClient(app) as client:
        wrapped.start()
        for _ in range(3):
            buf = io.BytesIO()
            np.save(buf, rng.standard_normal(INPUT_SHAPE).astype(np.float32))
            r = client.post("/v1/predict", content=buf.getvalue(), headers={"content-type": "application/x-npy"})
            assert r.status_code == 200, r.text
        text = client.get("/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("hmt_offload_answers_total", (("where", "local"),))] == 3
    assert samples[("hmt_offload_peer_errors_total", (("reason", "probe_refused"),))] >= 1
    assert samples[("hmt_offload_peer_usable", ())] == 0
    assert samples[("hmt_offload_breaker_opens_total", ())] >= 1
    assert samples[("hmt_offload_link_rtt_seconds", ())] >= 0
