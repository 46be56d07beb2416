#!/bin/bash
# issue 14 serve benchmark: a second repetition of ORT (same budget as bench2) and TVM (same as bench3),
# each with an ablation in the same run: headroom 1.0 (the p95 estimates against the whole compute budget).
set -x
cd /work/h-serve
date -u; uptime
B=$(python3 -c "import json;print(json.load(open('runs/bench2/new/results.json'))['engines']['onnxruntime']['budget_ms'])")
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench4/ort --engines onnxruntime --reps 1 --phase-s 4 --load-s 0 --budget-ms $B --extra-mode 'adaptive_headroom1={"correction": {"headroom": 1.0}}'
uptime
T=$(python3 -c "import json;print(json.load(open('runs/bench3/new/results.json'))['engines']['tvm']['budget_ms'])")
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench4/tvm --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms $T --extra-mode 'adaptive_headroom1={"correction": {"headroom": 1.0}}'
date -u; uptime
