#!/usr/bin/env bash
# The whole pipeline on the embedded default (2,000 CIFAR-10 images and a trained supernet shipped in the repo),
# minutes on a laptop-class CPU (train-supernet -> profile-device -> pareto -> convert -> fuse -> deploy -> serve). Every stage writes a directory under runs/demo/ with a
# checksummed manifest.json; rerunning resumes or replaces them atomically.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT=${HMT_DEMO_OUT:-runs/demo}
mkdir -p "$OUT"
# train-supernet at work: a tiny supernet on the embedded images (a few CPU minutes).
hmt train-supernet --preset tiny --out "$OUT/supernet-tiny"
# The rest of the pipeline runs on the supernet shipped with hmt (the pretrained CIFAR-10
# ResNet-56, elastified and specialized on a GPU: hmt/data/embedded/supernet-cifar-resnet56/PROVENANCE.md).
SUPERNET=hmt/data/embedded/supernet-cifar-resnet56
hmt profile-device --quick --supernet "$SUPERNET" --out "$OUT/profile"
# Accuracy measured on the embedded test images (CIFAR-10 test split, which it never trained on). The
# shipped supernet is specialized: its front is made of the variants it lists and their early exits.
hmt pareto --supernet "$SUPERNET" --profile "$OUT/profile" --data hmt/data/embedded \
    --evaluations 40 --population 12 --out "$OUT/pareto"
# Up to four variants spread along the front above 80% (early exits reach down to ~50%).
hmt convert --supernet "$SUPERNET" --pareto "$OUT/pareto" --max-variants 4 --min-accuracy 80 --out "$OUT/converted"
hmt fuse "$OUT/converted" --out "$OUT/fused"
hmt deploy --fused "$OUT/fused" --pareto "$OUT/pareto" --target x86-64 --out "$OUT/bundle-x86-64"
# 14 s of the on-device loop on that bundle: a real busy process on one core from 4 s to 11 s,
# the battery falling, a memory cut to 2 MB at 8 s (the largest variant needs 3.5, so a static
# largest runs over it); requests through the HTTP API, timeline PNG + CSV.
# --compare replays the same scenario once per variant served alone and prints, per phase, the
# adaptive run beside the best static choice in hindsight (the oracle) and the static largest.
hmt serve "$OUT/bundle-x86-64" --port 0 --scenario scripts/demo_scenario.csv --load burn --compare \
    --timeline-out "$OUT/serve"
echo "demo done: artifacts in $OUT"
