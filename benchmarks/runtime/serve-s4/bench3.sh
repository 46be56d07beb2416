#!/bin/bash
# issue 14 serve benchmark, TVM (engine 50-100x off the ORT profile): this tree and the baseline revision, one lock.
set -x
cd /work/h-serve
date -u; uptime
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench3/new --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 20
B=$(python3 -c "import json;print(json.load(open('runs/bench3/new/results.json'))['engines']['tvm']['budget_ms'])")
uptime
(cd /tmp/hmt-base && PYTHONPATH=/tmp/hmt-base python3 scripts/bench_serve.py --bundle /work/h-serve/runs/shipped/bundle-base --out /work/h-serve/runs/bench3/base --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms $B)
date -u; uptime
