#!/usr/bin/env bash
# GPU job: strong originals trained or measured as a user would (benchmarks/supernet/originals.py),
# then each elastified through the user path (train-supernet --model ... --weights ...).
# Every job runs in the background in its own process session and skips what is done, so the
# same command is rerun on the same warm machine until it prints "all done" (one command is
# limited to 10 minutes):
#   bash scripts/gpu_originals.sh BLOB WORKDIR [JOBS...]   (BLOB: scripts/gpu_pack_cifar.py pack output)
# JOBS (default: all): r18 mbv2 r56-measure r56 r18-elastic mbv2-elastic r56-elastic r18-front
#   mbv2-front r56-front, r18b-elastic r18b-front (a second ResNet-18 recipe, R18B_CONFIG), r18-e300 (r18-e300-sN: seed N,
#   the same split) and r18-b128 (the ResNet-18 original trained longer, or with batch 128), twin-w50 and twin-w50x25 (the
#   twins of its width variants e3.555555555555 and e3.522522522522, on r18's recipe), twin-w50-b128,
#   twin-w50x25-b128 and mbv2-b128 (batch 128), energy (issue 23's
#   NVML energy benchmark on ENERGY_GPU, alone on its GPU) (a front job waits for its elastic job: benchmarks/supernet/front.py on the GPU,
#   validation and test accuracy per variant, greedy paths chosen on the validation split)
# ELASTIC_CONFIG names the recipe of the elastic jobs (a train-supernet --config JSON); R18_CONFIG,
# MBV2_CONFIG and R56_CONFIG override it per model. A job whose weights were made elsewhere is marked
# done by putting NAME.safetensors in WORKDIR and touching NAME.done.
set -uo pipefail
BLOB=$1; W=$2; shift 2
JOBS=${*:-r18 mbv2 r56-measure r56 r18-elastic mbv2-elastic r56-elastic}
M=benchmarks/supernet/models
R56=${R56_TH:-.gpu/resnet56-4bfd9763.th}
CFG=${ELASTIC_CONFIG:-benchmarks/supernet/configs/elastic-user.json}
mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d "$W/cifar" ] || python3 scripts/gpu_pack_cifar.py unpack "$BLOB" "$W/cifar"
[ -f "$W/machine.txt" ] || { nvidia-smi -L > "$W/machine.txt"; lscpu | head -20 >> "$W/machine.txt"; }
started() { [ -f "$W/$1.started" ]; }
gpu_of() {  # R18_GPU and OTHER_GPU spread the jobs over GPUs (default: all on GPU 0); R18B_GPU,
  # MBV2_GPU and R56_GPU override them per model, GPU_MAP ("JOB=GPU JOB=GPU ...") per job
  local pair
  for pair in ${GPU_MAP:-}; do [ "${pair%%=*}" = "$1" ] && echo "${pair#*=}" && return; done
  case $1 in
    r18b*) echo "${R18B_GPU:-${R18_GPU:-0}}" ;;
    r18*) echo "${R18_GPU:-0}" ;;
    mbv2*) echo "${MBV2_GPU:-${OTHER_GPU:-0}}" ;;
    r56*) echo "${R56_GPU:-${OTHER_GPU:-0}}" ;;
    *) echo "${OTHER_GPU:-0}" ;;
  esac
}
bg() {  # name, command...: start once, in its own session (it outlives this command's return)
  local name=$1; shift
  started "$name" && return
  touch "$W/$name.started"
  CUDA_VISIBLE_DEVICES=${ON_GPU:-$(gpu_of "$name")} setsid nohup bash -c "$* > '$W/$name.log' 2>&1 && touch '$W/$name.done'" \
      < /dev/null > /dev/null 2>&1 &
}
orig() {  # name, model, extra args
  local name=$1 model=$2; shift 2
  bg "$name" python3 -m benchmarks.supernet.originals --model "$M/$model" --data "$W/cifar" \
      --cache-dir "$W/cache-$name" --out "$W/$name.json" --weights-out "$W/$name.safetensors" "$@"
}
elastic() {  # name, model, weights, recipe (waits for the weights' job)
  local name=$1 model=$2 parent=$3 cfg=$4
  [ -f "$W/$parent.done" ] || return
  local launch="python3 -m commands"  # NPROC > 1: data parallel over the GPUs the model's *_GPU lists (torchrun)
  [ "${NPROC:-1}" -gt 1 ] && launch="torchrun --standalone --nproc-per-node $NPROC -m commands"
  bg "$name" $launch train-supernet --model "$M/$model" --weights "$W/$parent.safetensors" \
      --input-shape 1,3,32,32 --data "$W/cifar" --config "$cfg" --cache-dir "$W/cache-$name" \
      --out "$W/$name"
}
front() {  # name of the elastic job (waits for it)
  local name=$1
  [ -f "$W/$name-elastic.done" ] || return
  bg "$name-front" python3 -m benchmarks.supernet.front --supernet "$W/$name-elastic" --data "$W/cifar" \
      --random "${FRONT_RANDOM:-60}" --greedy "${FRONT_GREEDY:-40}" --device cuda --out "$W/$name-front.csv"
}
for job in $JOBS; do
  case $job in
    r18) orig r18 cifar_resnet18.py:build --epochs 200 --lr 0.2 ;;
    r18-e300) orig r18-e300 cifar_resnet18.py:build --epochs 300 --lr 0.2 ;;  # longer
    r18-e300-s[0-9]) orig "$job" cifar_resnet18.py:build --epochs 300 --lr 0.2 --seed "${job##*-s}" ;;  # other seeds, same split
    r18-b128) orig r18-b128 cifar_resnet18.py:build --epochs 200 --lr 0.1 --batch-size 128 ;;  # more steps
    twin-w50) orig twin-w50 cifar_resnet18.py:build_w50 --epochs 200 --lr 0.2 ;;  # r18's recipe
    twin-w50x25) orig twin-w50x25 cifar_resnet18.py:build_w50x25 --epochs 200 --lr 0.2 ;;
    twin-w50-b128) orig twin-w50-b128 cifar_resnet18.py:build_w50 --epochs 200 --lr 0.1 --batch-size 128 ;;
    twin-w50x25-b128) orig twin-w50x25-b128 cifar_resnet18.py:build_w50x25 --epochs 200 --lr 0.1 --batch-size 128 ;;
    mbv2-b128) orig mbv2-b128 cifar_mobilenetv2.py:build --epochs 200 --lr 0.1 --batch-size 128 ;;
    mbv2) orig mbv2 cifar_mobilenetv2.py:build --epochs 200 --lr 0.2 ;;
    r56-measure)
      orig r56-pretrained cifar_resnet56.py:build --init "$R56" --epochs 0
      orig r56-pretrained-imagenet-norm cifar_resnet56.py:build --init "$R56" --epochs 0 --input-norm imagenet ;;
    r56) orig r56 cifar_resnet56.py:build --init "$R56" --epochs 30 --lr 0.02 ;;
    r18-elastic) elastic r18-elastic cifar_resnet18.py:build r18 "${R18_CONFIG:-$CFG}" ;;
    mbv2-elastic) elastic mbv2-elastic cifar_mobilenetv2.py:build mbv2 "${MBV2_CONFIG:-$CFG}" ;;
    r56-elastic) elastic r56-elastic cifar_resnet56.py:build r56 "${R56_CONFIG:-$CFG}" ;;
    r18b-elastic) elastic r18b-elastic cifar_resnet18.py:build r18 "${R18B_CONFIG:-$CFG}" ;;
    r18-front|r18b-front|mbv2-front|r56-front) front "${job%-front}" ;;
    energy) ON_GPU=${ENERGY_GPU:-0} bg energy python3 -m benchmarks.device.energy_heldout --out "$W/energy_heldout.json" ;;
  esac
done
sleep "${POLL_S:-0}"
for f in "$W"/*.log; do echo "== $(basename "$f"): $(tail -c 300 "$f" | tr '\r' '\n' | tail -n 2)"; done
pending=0
for job in $JOBS; do
  name=$job; [ "$job" = r56-measure ] && name=r56-pretrained
  [ -f "$W/$name.done" ] || pending=1
done
[ "$pending" = 0 ] && echo "all done"
