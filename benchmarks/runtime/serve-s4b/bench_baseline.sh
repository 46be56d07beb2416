#!/bin/bash
# issue 14, session 4b: the code before this branch (5285591, git archive'd to /tmp/serve2_old) on the
# same bundle, budget and headroom 1.0 as bench_final.sh's TVM run, right after it (not the same run).
set -x
date -u; uptime
rm -rf /tmp/serve2_old && mkdir /tmp/serve2_old && git -C /work/h-serve2 archive 5285591 | tar -x -C /tmp/serve2_old
cd /tmp/serve2_old
PYTHONPATH=$PWD python3 scripts/bench_serve.py --bundle /work/h-serve2/runs/shipped/bundle-x86-64 --out /work/h-serve2/runs/s4b/tvm_base --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 20 --tvm-budget-ms 75.11 --serve-json '{"correction": {"headroom": 1.0}}'
date -u; uptime
