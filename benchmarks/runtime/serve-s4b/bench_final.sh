#!/bin/bash
# issue 14, session 4b, final code (per-level estimates, headroom 1.0 default; the shipped bundle's
# serve.json pins headroom 0.8, so every run gets 1.0 via --serve-json): TVM and ORT, 2 repetitions,
# adaptive / unloaded / static largest / static smallest plus one load level as the ablation.
set -x
cd /work/h-serve2
date -u; uptime; git log --oneline | head -1
PYTHONPATH=$PWD python3 scripts/bench_decision_loop.py --baseline 5285591 --reps 3 --seconds 5 --out benchmarks/runtime/serve-s4b/decision_loop_final.json
date -u; uptime
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s4b/tvm_final --engines tvm --reps 2 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms 75.11 --serve-json '{"correction": {"headroom": 1.0}}' --extra-mode 'adaptive_1level={"estimates": {"load_buckets": 1}}'
date -u; uptime
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s4b/ort_final --engines onnxruntime --reps 2 --phase-s 4 --load-s 0 --budget-ms 7.3493 --serve-json '{"correction": {"headroom": 1.0}}' --extra-mode 'adaptive_1level={"estimates": {"load_buckets": 1}}'
date -u; uptime
