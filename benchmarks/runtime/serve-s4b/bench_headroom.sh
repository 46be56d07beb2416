#!/bin/bash
# issue 14, session 4b: headroom 0.8 (default) against 1.0 on TVM, 2 more repetitions in one run
# (same budget and scenario as bench.sh), to decide the default.
set -x
cd /work/h-serve2
date -u; uptime; git log --oneline | head -1
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s4b/tvm_headroom --engines tvm --reps 2 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms 75.11 --extra-mode 'adaptive_headroom1={"correction": {"headroom": 1.0}}'
date -u; uptime
