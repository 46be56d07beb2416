#!/bin/bash
# issue 14, session 5: the floor over a time span (estimates.floor_span_s 0.2 s) against the default
# (the last 3 samples) on ONNX Runtime at 7.35 ms, in one run (final code; ablation as an extra mode).
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
date -u; uptime; git log --oneline | head -1
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s5/ort_span --engines onnxruntime --reps 1 --phase-s 4 --load-s 0 --budget-ms 7.3493 --extra-mode 'adaptive_span02={"estimates": {"floor_span_s": 0.2}}'
date -u; uptime
