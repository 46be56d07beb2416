#!/bin/bash
# issue 14 serve benchmark, ORT, two more repetitions of this tree at the same budget as bench2.
set -x
cd /work/h-serve
date -u; uptime
B=$(python3 -c "import json;print(json.load(open('runs/bench2/new/results.json'))['engines']['onnxruntime']['budget_ms'])")
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/bench4/new --engines onnxruntime --reps 2 --phase-s 4 --load-s 0 --budget-ms $B
date -u; uptime
