#!/bin/bash
# issue 14, session 4b: ORT with the budget calibrated in the run (1.3 x the largest variant's
# unloaded p95, as session 4's rep 1), because at the fixed 7.35 ms the quiet machine's static
# largest missed only 2-5%; final code, headroom 1.0; one repetition.
set -x
cd /work/h-serve2
date -u; uptime; git log --oneline | head -1
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s4b/ort_cal --engines onnxruntime --reps 1 --phase-s 4 --load-s 0 --serve-json '{"correction": {"headroom": 1.0}}'
date -u; uptime
