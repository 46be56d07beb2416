#!/usr/bin/env bash
# GPU job, one lease: ResNet-18 originals (300 epochs, one per seed in ORIG_SEEDS, default "1"), the
# one with the highest validation accuracy cut with no elastic fine-tuning, then the SPECS
# specialized from that cut (hmt specialize, detached exits, lr 0.2). Every step runs in the
# background and skips what is done, so the same command is rerun on the same warm machine (through
# scripts/gpu_poll.sh) until it prints "all done":
#   SPECS='r18-w50=r18:e3.555555555555:120 r18-a=r18:e3.575555555555:120' bash scripts/gpu_r18_cut.sh WORKDIR
# WORKDIR holds cifar10.blob (scripts/gpu_pack_cifar.py pack), or BLOB_PARTS names its parts in
# order (carried in separate calls: the device tool carries 64 MiB a call with the tree) and
# BLOB_SHA256 the whole blob's sha256, checked after joining. An original carried in as WORKDIR/r18.safetensors
# is used as it is (no original trained).
set -uo pipefail
W=$1
: "${SPECS:?SPECS: NAME=r18:SELECTION:EPOCHS entries, as in scripts/gpu_specialize.sh}"
mkdir -p "$W"
if [ ! -f "$W/cifar10.blob" ] && [ -n "${BLOB_PARTS:-}" ]; then
  # shellcheck disable=SC2086  # BLOB_PARTS is a list of paths
  cat $BLOB_PARTS > "$W/cifar10.blob.partial" || exit 3
  if [ -n "${BLOB_SHA256:-}" ]; then
    echo "$BLOB_SHA256  $W/cifar10.blob.partial" | sha256sum -c --quiet - || { rm -f "$W/cifar10.blob.partial"; exit 3; }
  fi
  mv "$W/cifar10.blob.partial" "$W/cifar10.blob"
fi
[ -f "$W/cifar10.blob" ] || { echo "gpu_r18_cut.sh: no $W/cifar10.blob (and no BLOB_PARTS)" >&2; exit 2; }
SEEDS=${ORIG_SEEDS:-1}
# WORKDIR/r18.safetensors carried in (an original trained in an earlier lease): no original is trained;
# R18_SHA256, where given, is checked first.
if [ -f "$W/r18.safetensors" ] && [ -n "${R18_SHA256:-}" ] && [ ! -f "$W/r18.checked" ]; then
  echo "$R18_SHA256  $W/r18.safetensors" | sha256sum -c --quiet - || { echo "r18.safetensors: wrong sha256" >&2; exit 3; }
  touch "$W/r18.checked"
fi
if [ ! -f "$W/r18.safetensors" ]; then
  bash scripts/gpu_originals.sh "$W/cifar10.blob" "$W" $(for s in $SEEDS; do echo "r18-e300-s$s"; done) > /dev/null
  for s in $SEEDS; do echo "== r18-e300-s$s: $(tail -c 200 "$W/r18-e300-s$s.log" 2>/dev/null | tr '\r' '\n' | tail -n 1)"; done
  for s in $SEEDS; do [ -f "$W/r18-e300-s$s.done" ] || { echo "originals running"; exit 0; }; done
fi
if [ ! -f "$W/r18.safetensors" ]; then
  best=$(python3 - "$W" $SEEDS <<'PY'
import json, sys
work = sys.argv[1]
docs = {s: json.load(open(f"{work}/r18-e300-s{s}.json"))["results"] for s in sys.argv[2:]}
for s, r in docs.items():
    print(f"seed {s}: validation {r['val_acc']:.4f}, test {r['test_acc']:.4f}", file=sys.stderr)
print(max(docs, key=lambda s: docs[s]["val_acc"]))
PY
)
  echo "original chosen on validation: seed $best"
  echo "$best" > "$W/chosen_seed.txt"
  cp "$W/r18-e300-s$best.safetensors" "$W/r18.safetensors"
fi
MODELS=r18 GPUS=${GPUS:-0} R18_EPOCHS=0 FRONT_RANDOM=0 SPEC_EXTRA=${SPEC_EXTRA:---lr 0.2} SPECS="$SPECS" \
  bash scripts/gpu_specialize.sh "$W"
