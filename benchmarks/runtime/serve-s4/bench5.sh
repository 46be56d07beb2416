#!/bin/bash
# issue 14 serve benchmark, TVM: this tree with the probe backoff (8 s cap) as an ablation in the same run.
set -x
cd /work/h-serve
date -u; uptime; git log --oneline | head -1
T=$(python3 -c "import json;print(json.load(open('runs/bench3/new/results.json'))['engines']['tvm']['budget_ms'])")
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench5/tvm --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms $T --extra-mode 'adaptive_backoff={"switch": {"probe_backoff_max_s": 8.0}}'
date -u; uptime
