#!/bin/bash
# issue 14, session 5: a first TVM run of the code before this branch (129e1e0, git archive'd to
# /tmp/serve3_base) on the shipped supernet's bundle, budget calibrated, 10 req/s (this bundle's largest variant runs ~89 ms on untuned TVM: 20 req/s saturates the 2 cores) (1.3 x the largest variant's
# unloaded p95), for per-window traces of the adaptive run (requests + ticks CSVs).
set -x
date -u; uptime
cd /tmp/serve3_base
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle /work/h-serve3/runs/shipped/bundle-x86-64 --out /work/h-serve3/runs/s5/trace_base --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 10
date -u; uptime
