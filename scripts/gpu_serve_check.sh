#!/usr/bin/env bash
# On the GPU host (benchmarks/README.md, table "precision"): hmt serve on the demo bundle with the target's providers (cuda, cpu), one
# request through the client, then /v1/status's providers and runtime notes.
set -u
PYTHONPATH=/tmp/site:$PWD python3 -m commands serve runs/demo/bundle-x86-64 --port 8765 --engine onnxruntime > /tmp/serve.log 2>&1 &
PID=$!
for i in $(seq 1 60); do
  PYTHONPATH=/tmp/site:$PWD python3 -c "
from hmt.client import HmtClient
c = HmtClient('http://127.0.0.1:8765'); h = c.health(); assert h.get('ready'), h" 2>/dev/null && break
  sleep 1
done
PYTHONPATH=/tmp/site:$PWD python3 - <<'PY'
import json, time
import numpy as np
from hmt.client import HmtClient
c = HmtClient('http://127.0.0.1:8765')
x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
t = []
for _ in range(50):
    s = time.perf_counter(); a = c.predict(x); t.append((time.perf_counter() - s) * 1e3)
st = c.status()
print("answer", {k: a[k] for k in a if k in ("class_index", "arch_id", "confidence")})
print("client p50 ms", round(float(np.median(t)), 3))
print("providers", st.get("providers"))
print("active", st.get("active_variant") or st.get("active"))
print("runtime_notes", json.dumps(st.get("runtime_notes"), indent=1))
PY
kill $PID; sleep 1; tail -5 /tmp/serve.log
