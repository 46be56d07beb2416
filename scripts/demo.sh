#!/usr/bin/env bash
# The whole pipeline on the embedded default (2,000 CIFAR-10 images shipped in the repo),
# minutes on a laptop-class CPU (train-supernet -> profile-device -> pareto -> convert -> fuse -> deploy -> serve). Every stage writes a directory under runs/demo/ with a
# checksummed manifest.json; rerunning resumes or replaces them atomically.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${HMT_DEMO_OUT:-runs/demo}
mkdir -p "$OUT"
hmt train-supernet --preset tiny --out "$OUT/supernet"
hmt profile-device --quick --supernet "$OUT/supernet" --out "$OUT/profile"
hmt pareto --supernet "$OUT/supernet" --profile "$OUT/profile" --evaluations 40 --population 12 --out "$OUT/pareto"
hmt convert --supernet "$OUT/supernet" --pareto "$OUT/pareto" --max-variants 4 --out "$OUT/converted"
hmt fuse "$OUT/converted" --out "$OUT/fused"
hmt deploy --fused "$OUT/fused" --pareto "$OUT/pareto" --target x86-64 --out "$OUT/bundle-x86-64"
# 14 s of the on-device loop on that bundle: a real busy process on one core from 4 s to 11 s,
# the battery falling, a memory cut at 8 s; requests through the HTTP API, timeline PNG + CSV.
hmt serve "$OUT/bundle-x86-64" --port 0 --scenario scripts/demo_scenario.csv --load burn --timeline-out "$OUT/serve"
echo "demo done: artifacts in $OUT"
