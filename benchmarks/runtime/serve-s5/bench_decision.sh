#!/bin/bash
# issue 14, session 5: decision time in the running loop, this branch against 129e1e0 (alternating, 3 reps).
set -x
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
date -u; uptime; git log --oneline | head -1
PYTHONPATH=$PWD python3 scripts/bench_decision_loop.py --baseline 129e1e0 --reps 3 --seconds 5 --out benchmarks/runtime/serve-s5/decision_loop.json
date -u; uptime
