#!/usr/bin/env bash
# The shipped supernet (preset cifar-resnet56) on one GPU, one command under 10 minutes.
#   bash scripts/gpu_shipped.sh BLOB OUTDIR     (BLOB: scripts/gpu_pack_cifar.py pack output)
set -uo pipefail
BLOB=$1; OUT=$2; W=/tmp/ship; BUDGET_S=${BUDGET_S:-560}
mkdir -p "$W" "$OUT"; start=$(date +%s); END=$(( start + BUDGET_S ))
export PYTHONPATH=$PWD HMT_CACHE_DIR=$W/cache
run() { timeout $(( END - $(date +%s) )) "$@"; }
python3 scripts/gpu_pack_cifar.py unpack "$BLOB" "$W/cifar"
nvidia-smi -L > "$W/gpus.txt"
run python3 -m commands train-supernet --preset cifar-resnet56 --pretrained .gpu/resnet56-4bfd9763.th \
    --data "$W/cifar" --out "$W/r56" --json > "$W/r56.json" 2> "$W/r56.err" \
&& tar czf "$OUT/r56-supernet.tar.gz" -C "$W" r56 \
&& run python3 scripts/bench_front.py --supernet "$W/r56" --data "$W/cifar" --random 40 --out "$W/r56-front.csv" 2>> "$W/r56.err"
rm -rf "$W"/*.ckpt
tar czf "$OUT/results.tar.gz" -C "$W" --exclude=cache --exclude=cifar --exclude=r56 .
tail -3 "$W/r56.err"; echo "done after $(( $(date +%s) - start )) s"
