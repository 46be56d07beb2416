#!/bin/bash
# issue 14 serve benchmark, session 4b: per-load-level estimates. ORT and TVM, 2 repetitions each;
# adaptive, adaptive without busy cores, static largest, static smallest in one run, with two
# ablations in the same run: one load level (the estimates as before, ageing within the level)
# and headroom 1.0 (the p95 estimates against the whole compute budget instead of 80 %).
# Budgets as in session 4 (serve-s4/bench2.sh, bench3.sh): ORT 7.35 ms, TVM 75.1 ms.
set -x
cd /work/h-serve2
date -u; uptime; git log --oneline | head -1
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s4b/ort --engines onnxruntime --reps 2 --phase-s 4 --load-s 0 --budget-ms 7.3493 --extra-mode 'adaptive_1level={"estimates": {"load_buckets": 1}}' --extra-mode 'adaptive_headroom1={"correction": {"headroom": 1.0}}'
date -u; uptime
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s4b/tvm --engines tvm --reps 2 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms 75.11 --extra-mode 'adaptive_1level={"estimates": {"load_buckets": 1}}' --extra-mode 'adaptive_headroom1={"correction": {"headroom": 1.0}}'
date -u; uptime
PYTHONPATH=$PWD python3 scripts/bench_decision_loop.py --baseline 5285591 --reps 3 --seconds 5 --out benchmarks/runtime/serve-s4b/decision_loop.json
date -u; uptime
