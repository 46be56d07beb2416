#!/usr/bin/env bash
# Issue 11: three longer ResNet-18 supernet recipes side by side on a 4-GPU host,
# and the three twins trained alone for the same total epochs (60 + 3x2 + 4 + 160 = 230).
#   GPU0 long        the cifar10 preset with 160 fine-tuning epochs (was 80)
#   GPU1 structured  + half the random subnets drawn as width levels, exits from the last two stages
#   GPU2 widths      + only the width operators (inner and stream), no low-rank, no skips
#   GPU3 the twins   e3.B55B55B55B55, e3.5BB5BB5BB5BB, e3.55S55S55S55S, alone, 230 epochs, in parallel
# Every stage is resumable and skips what is done, so the same command is rerun on the same warm
# machine until it prints "all done" (one command is limited to 10 minutes):
#   bash scripts/gpu_issue11_long.sh BLOB OUTDIR     (BLOB: scripts/gpu_pack_cifar.py pack output)
# On fewer GPUs: GPUS="0 0 0 0" runs every job on GPU 0 at once (small CIFAR jobs leave an H100
# mostly idle, so they share it well); RECIPES="structured widths" leaves a recipe out.
# Results (fronts, training metrics, twins, the headline timed on the host CPU) go to OUTDIR.
set -uo pipefail
BLOB=$1; OUT=$2; W=/tmp/i11l; BUDGET_S=${BUDGET_S:-560}
CFG=$PWD/benchmarks/supernet/configs
mkdir -p "$W" "$OUT"
export PYTHONPATH=$PWD HMT_CACHE_DIR=$W/cache
start=$(date +%s); END=$(( start + BUDGET_S ))
[ -d "$W/cifar" ] || python3 scripts/gpu_pack_cifar.py unpack "$BLOB" "$W/cifar"
[ -f "$W/gpus.txt" ] || { nvidia-smi -L > "$W/gpus.txt"; lscpu | head -20 >> "$W/gpus.txt"; }
run() {  # every job stops by the deadline; a stage cut short is redone on the next call
  local left=$(( END - $(date +%s) ))
  [ "$left" -gt 5 ] || return 124
  timeout "$left" "$@"
}
TWINS="--arch resnet18-d4c397.e3.B55B55B55B55 --arch resnet18-d4c397.e3.5BB5BB5BB5BB --arch resnet18-d4c397.e3.55S55S55S55S"
recipe() {  # GPU, name (= config file name)
  local gpu=$1 name=$2 twins=$TWINS
  [ "$name" = widths ] && twins=""  # the twins' ids are of the full space
  export CUDA_VISIBLE_DEVICES=$gpu
  if [ ! -f "$W/$name/manifest.json" ]; then
    run python3 -m commands train-supernet --preset cifar10 --config "$CFG/$name.json" --data "$W/cifar" \
        --out "$W/$name" --json > "$W/$name.json" 2>> "$W/$name.err" || return
  fi
  if [ ! -f "$W/$name-front.done" ]; then
    # shellcheck disable=SC2086
    run python3 -m benchmarks.supernet.front --supernet "$W/$name" --data "$W/cifar" --random 60 --greedy 50 $twins \
        --out "$W/$name-front.csv" 2>> "$W/$name.err" && touch "$W/$name-front.done" || return
  fi
  [ -f "$W/headline-gpuhost-$name.json" ] || run python3 -m benchmarks.supernet.headline --front "$W/$name-front.csv" \
      --supernet "$W/$name" --candidates 4 --bursts 5 --out "$W/headline-gpuhost-$name.json" 2>> "$W/$name.err"
}
twin() {  # name, arch id
  [ -f "$W/twin-$1.json" ] && return
  CUDA_VISIBLE_DEVICES=${G[3]} run python3 -m benchmarks.supernet.standalone --data "$W/cifar" --epochs 230 \
      --operators w75,w50,w25,lr50,skip,sw75,sw50,sw25 --job "$1=resnet18:$2" --checkpoint-dir "$W/twin-ckpt" \
      --out "$W/twin-$1.json" 2>> "$W/twin-$1.err"
}
read -r -a G <<< "${GPUS:-0 1 2 3}"
RECIPES=${RECIPES:-long structured widths}
i=0
for name in $RECIPES; do recipe "${G[$i]}" "$name" & i=$(( i + 1 )); done
twin large resnet18-d4c397.e3.B55B55B55B55 &
twin middle resnet18-d4c397.e3.5BB5BB5BB5BB &
twin small resnet18-d4c397.e3.55S55S55S55S &
wait
done_all=1
for f in $RECIPES; do [ -f "$W/headline-gpuhost-$f.json" ] || done_all=0; done
for f in large middle small; do [ -f "$W/twin-$f.json" ] || done_all=0; done
cp "$W"/*.json "$W"/*.csv "$W/gpus.txt" "$OUT"/ 2>/dev/null
for n in $RECIPES; do
  [ -f "$W/$n/manifest.json" ] && cp "$W/$n/history.json" "$OUT/history-$n.json" 2>/dev/null
done
for f in "$W"/*.err; do echo "== $f"; grep -v -i warn "$f" | tail -3; done
ls "$W/twin-ckpt" 2>/dev/null; python3 - "$W" <<'EOF'
import sys, torch, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.ckpt/checkpoint.pt")) + sorted(pathlib.Path(sys.argv[1]).glob("twin-ckpt/*/checkpoint.pt")):
    s = torch.load(p, map_location="cpu", weights_only=True)
    print(p.parent.name, {k: s[k] for k in ("phase", "epoch", "epochs_run") if k in s})
EOF
[ "$done_all" = 1 ] && echo "all done after $(( $(date +%s) - start )) s" || echo "not done: rerun the same command"
