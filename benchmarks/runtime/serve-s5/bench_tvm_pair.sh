#!/bin/bash
# issue 14, session 5: TVM on the shipped supernet's bundle, this branch and the code before it
# (129e1e0, git archive'd to /tmp/serve3_base), one repetition each, back to back under one lock.
# Usage: bench_tvm_pair.sh NAME [BUDGET_MS]   (no budget: the first run calibrates it, 1.3 x the
# largest variant's unloaded p95, and the baseline reuses it). 10 requests/s: this bundle's largest
# variant takes ~89 ms on untuned TVM here, and 20/s saturates the 2 cores.
set -x
NAME=$1
BUDGET=${2:-}
W=${W:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}  # the checkout under test
date -u; uptime; git -C $W log --oneline | head -1
rm -rf /tmp/serve3_base && mkdir /tmp/serve3_base && git -C $W archive 129e1e0 | tar -x -C /tmp/serve3_base
cd $W
PYTHONPATH=$W python3 scripts/bench_serve.py --bundle runs/shipped/bundle-x86-64 --out runs/s5/${NAME}_new --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 10 ${BUDGET:+--tvm-budget-ms $BUDGET}
BUDGET=$(python3 -c "import json; print(json.load(open('runs/s5/${NAME}_new/results.json'))['engines']['tvm']['budget_ms'])")
date -u; uptime
cd /tmp/serve3_base
PYTHONPATH=/tmp/serve3_base python3 scripts/bench_serve.py --bundle $W/runs/shipped/bundle-x86-64 --out $W/runs/s5/${NAME}_base --engines tvm --reps 1 --phase-s 4 --load-s 0 --tvm-rate-hz 10 --tvm-budget-ms $BUDGET
date -u; uptime
