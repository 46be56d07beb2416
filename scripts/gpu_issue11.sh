#!/usr/bin/env bash
# Issue 11 on a 4-GPU machine, one command under 10 minutes (benchmarks/supernet/results/ records
# the runs). GPU0: the ResNet-18 supernet (preset cifar10), its front on the 10k test
# images, the headline timed on the host CPU; GPU2: the same with seed 1; GPU3: the same
# with --finetune-original (ablation). GPU1: the shipped supernet (preset cifar-resnet56
# from the pretrained ResNet-56). STANDALONE=1 instead trains the three twins and the
# standalone ResNet-20/32/56 and MobileNetV2 0.5/1.0 (first run) on GPUs 2-3.
#   bash scripts/gpu_issue11.sh BLOB OUTDIR     (BLOB: scripts/gpu_pack_cifar.py pack output)
# The recipe of these runs (80 fine-tuning epochs, uniform sampling) is kept in
# benchmarks/supernet/configs/uniform_80_epochs.json; the cifar10 preset has since become
# scripts/gpu_issue11_long.sh's "structured" recipe (benchmarks/supernet/results/headline_r18.json).
set -uo pipefail
BLOB=$1; OUT=$2; W=/tmp/i11; BUDGET_S=${BUDGET_S:-565}
mkdir -p "$W" "$OUT"
export PYTHONPATH=$PWD HMT_CACHE_DIR=$W/cache
start=$(date +%s); END=$(( start + BUDGET_S ))
python3 scripts/gpu_pack_cifar.py unpack "$BLOB" "$W/cifar"
python3 -c "from pathlib import Path; from hmt.data import load_dataset; d = load_dataset('cifar10', Path('$W/cifar')); print(d.train_x.shape, d.test_x.shape)" > "$W/data.txt" 2>&1
echo "data ready after $(( $(date +%s) - start )) s" >> "$W/data.txt"
nvidia-smi -L > "$W/gpus.txt"; lscpu | head -20 >> "$W/gpus.txt"
EPOCHS=150   # the supernet's total epochs: 60 + 3 x 2 + 4 + 80
OPS=w75,w50,w25,lr50,skip,sw75,sw50,sw25
run() { timeout $(( END - $(date +%s) )) "$@"; }  # every job stops by the deadline
TWINS="--arch resnet18-d4c397.e3.B55B55B55B55 --arch resnet18-d4c397.e3.5BB5BB5BB5BB --arch resnet18-d4c397.e3.55S55S55S55S"
r18() {  # GPU, name, extra train-supernet flags
  local gpu=$1 name=$2; shift 2
  export CUDA_VISIBLE_DEVICES=$gpu
  run python3 -m commands train-supernet --preset cifar10 --config benchmarks/supernet/configs/uniform_80_epochs.json --data "$W/cifar" --out "$W/$name" --json "$@" > "$W/$name.json" 2> "$W/$name.err" \
  && run python3 -m benchmarks.supernet.front --supernet "$W/$name" --data "$W/cifar" --random 90 $TWINS --out "$W/$name-front.csv" 2>> "$W/$name.err" \
  && run python3 -m benchmarks.supernet.headline --front "$W/$name-front.csv" --supernet "$W/$name" --out "$W/headline-gpuhost-$name.json" 2>> "$W/$name.err"
}
r18 0 r18 &
r18 2 r18-seed1 --seed 1 &
r18 3 r18-ftorig --finetune-original &
(
  export CUDA_VISIBLE_DEVICES=1
  run python3 -m commands train-supernet --preset cifar-resnet56 --pretrained .gpu/resnet56-4bfd9763.th \
      --data "$W/cifar" --out "$W/r56" --json > "$W/r56.json" 2> "$W/r56.err" \
  && tar czf "$OUT/r56-supernet.tar.gz" -C "$W" r56 \
  && run python3 -m benchmarks.supernet.front --supernet "$W/r56" --data "$W/cifar" --random 90 --out "$W/r56-front.csv" 2>> "$W/r56.err"
) &
if [ "${STANDALONE:-0}" = 1 ]; then
for twin in large=resnet18:resnet18-d4c397.e3.B55B55B55B55 middle=resnet18:resnet18-d4c397.e3.5BB5BB5BB5BB \
            small=resnet18:resnet18-d4c397.e3.55S55S55S55S; do
  name=${twin%%=*}
  CUDA_VISIBLE_DEVICES=2 run python3 -m benchmarks.supernet.standalone --data "$W/cifar" --epochs $EPOCHS --operators $OPS \
      --job "$twin" --out "$W/twin-$name.json" 2> "$W/twin-$name.err" &
done
BASE_EPOCHS=100  # standalone baselines: all five must finish inside the lease
for base in resnet20=cifar_resnet20 resnet32=cifar_resnet32 resnet56=cifar_resnet56 mbv2_050=mobilenetv2_050 mbv2=mobilenetv2; do
  name=${base%%=*}
  gpu=3; [ "$name" = mbv2 ] && gpu=2
  CUDA_VISIBLE_DEVICES=$gpu run python3 -m benchmarks.supernet.standalone --data "$W/cifar" --epochs $BASE_EPOCHS \
      --job "$base" --out "$W/standalone-$name.json" 2> "$W/standalone-$name.err" &
done
fi
wait
echo "all done after $(( $(date +%s) - start )) s" >> "$W/data.txt"
rm -rf "$W"/*.ckpt
tar czf "$OUT/results.tar.gz" -C "$W" --exclude=cache --exclude=cifar --exclude=r18 --exclude=r18-seed1 --exclude=r18-ftorig --exclude=r56 .
for f in "$W"/*.err; do echo "== $f"; tail -3 "$f"; done
cat "$W/data.txt"
