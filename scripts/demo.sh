#!/usr/bin/env bash
# The whole pipeline on the embedded default (2,000 CIFAR-10 images shipped in the repo),
# minutes on a laptop-class CPU (train-supernet -> profile-device -> pareto -> convert -> fuse). Every stage writes a directory under runs/demo/ with a
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
echo "demo done: artifacts in $OUT"
