#!/bin/bash
# issue 14 serve benchmark: this tree (ORT fuse's threads, ORT 1 thread) and the baseline revision, one lock.
set -x
cd /work/h-serve
date -u; uptime
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench2/new --engines onnxruntime --reps 1 --phase-s 4 --load-s 0
B=$(python3 -c "import json;print(json.load(open('runs/bench2/new/results.json'))['engines']['onnxruntime']['budget_ms'])")
uptime
(cd /tmp/hmt-base && PYTHONPATH=/tmp/hmt-base python3 scripts/bench_serve.py --bundle /work/h-serve/runs/shipped/bundle-base --out /work/h-serve/runs/bench2/base --engines onnxruntime --reps 1 --phase-s 4 --load-s 0 --budget-ms $B)
uptime
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench2/new1 --engines onnxruntime@1 --reps 1 --phase-s 4 --load-s 0 --budget-ms $B
uptime
PYTHONPATH=$PWD python3 scripts/bench_decision_loop.py --baseline 1e54622 --reps 3 --seconds 5 --out runs/bench2/decision_loop.json
date -u; uptime
