#!/usr/bin/env bash
# The shipped supernet (preset cifar-resnet56) on one GPU. Resumable: rerun the same command on the
# same warm machine until it prints "all done" (one command is limited to 10 minutes).
#   bash scripts/gpu_shipped.sh BLOB OUTDIR     (BLOB: scripts/gpu_pack_cifar.py pack output)
# The shipped supernet before 2026-11-26's retraining was made with
# --config benchmarks/supernet/configs/shipped_uniform_65_epochs.json (EXTRA="--config ..." passes it).
set -uo pipefail
BLOB=$1; OUT=$2; W=/tmp/ship; BUDGET_S=${BUDGET_S:-560}
mkdir -p "$W" "$OUT"; start=$(date +%s); END=$(( start + BUDGET_S ))
export PYTHONPATH=$PWD HMT_CACHE_DIR=$W/cache
run() {
  local left=$(( END - $(date +%s) ))
  [ "$left" -gt 5 ] || return 124
  timeout "$left" "$@"
}
[ -d "$W/cifar" ] || python3 scripts/gpu_pack_cifar.py unpack "$BLOB" "$W/cifar"
[ -f "$W/gpus.txt" ] || nvidia-smi -L > "$W/gpus.txt"
if [ ! -f "$W/r56/manifest.json" ]; then
  # shellcheck disable=SC2086
  run python3 -m commands train-supernet --preset cifar-resnet56 --pretrained .gpu/resnet56-4bfd9763.th \
      ${EXTRA:-} --data "$W/cifar" --out "$W/r56" --json > "$W/r56.json" 2>> "$W/r56.err"
fi
if [ -f "$W/r56/manifest.json" ]; then
  tar czf "$OUT/r56-supernet.tar.gz" -C "$W" r56
  [ -f "$W/r56-front.done" ] || { run python3 -m benchmarks.supernet.front --supernet "$W/r56" --data "$W/cifar" \
      --random "${FRONT_RANDOM:-40}" --greedy "${FRONT_GREEDY:-30}" --out "$W/r56-front.csv" 2>> "$W/r56.err" \
      && touch "$W/r56-front.done"; }
fi
cp "$W"/*.json "$W"/*.csv "$W/gpus.txt" "$OUT"/ 2>/dev/null
[ -f "$W/r56/history.json" ] && cp "$W/r56/history.json" "$OUT/history-r56.json"
grep -v -i warn "$W/r56.err" | tail -3
[ -f "$W/r56-front.done" ] && echo "all done after $(( $(date +%s) - start )) s" || echo "not done: rerun the same command"
