#!/usr/bin/env bash
# GPU job: elastify the three strong originals (shortened tied recipes), then specialize chosen
# variants of each (hmt specialize: only their paths fine-tuned, KD from the frozen original), each
# variant in its own artifact and job, then evaluate them (validation, test and test halves) with
# benchmarks/supernet/front.py; a front of each elastic supernet runs beside the specializations.
# Every job runs in the background in its own process session and skips what is done, so the same
# command is rerun on the same warm machine until it prints "all done" (one command is limited to
# 10 minutes):
#   bash scripts/gpu_specialize.sh WORKDIR
# WORKDIR holds cifar10.blob (scripts/gpu_pack_cifar.py pack) and r18/r56/mbv2.safetensors (the
# originals of benchmarks/supernet/originals.py). Knobs (environment): GPUS (default "0 1 2 3",
# two GPUs: GPUS="0 1", about 16 minutes on two H200s with the defaults,
# each job on the GPU running the fewest jobs), R18_EPOCHS R56_EPOCHS MBV2_EPOCHS (elastic fine-tuning epochs),
# R56_CONFIG and R56_FACTORY (the shipped supernet: shipped-cifar-resnet56 and cifar_resnet56),
# SPEC_EPOCHS, FRONT_RANDOM, MODELS (default "r18 r56 mbv2"), SPECS (which specializations, default all of SPEC_LIST; NAME=model:selection[:epochs[:options]] adds one, options comma-separated, e.g. --exits=detached,--kd-temperature=4), DATA (an unpacked
# CIFAR-10 JPEG folder instead of WORKDIR/cifar10.blob), EXTRA (more train-supernet / specialize
# options, e.g. "--device cpu --max-train-samples 256" for a CPU check of the script), SPEC_EXTRA
# (more specialize options only, e.g. "--lr 0.2").
set -uo pipefail
W=$1
M=benchmarks/supernet/models
C=benchmarks/supernet/configs
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$W"
DATA=${DATA:-$W/cifar}
[ -d "$DATA" ] || python3 scripts/gpu_pack_cifar.py unpack "$W/cifar10.blob" "$DATA"
[ -f "$W/machine.txt" ] || { nvidia-smi -L > "$W/machine.txt" 2>&1; lscpu | head -20 >> "$W/machine.txt"; }
read -r -a GPU_LIST <<< "${GPUS:-0 1 2 3}"
EXTRA=${EXTRA:-}
bg() {  # name, command...: start once, on the next GPU, in its own session
  local name=$1; shift
  [ -f "$W/$name.started" ] && return
  touch "$W/$name.started"
  local gpu=${GPU_LIST[0]} best=999 g n f
  for g in "${GPU_LIST[@]}"; do  # the GPU running the fewest of this workdir's jobs
    n=0
    for f in "$W"/*.gpu; do
      [ -f "$f" ] && [ "$(cat "$f")" = "$g" ] && [ ! -f "${f%.gpu}.done" ] && [ ! -f "${f%.gpu}.failed" ] && n=$((n + 1))
    done
    [ "$n" -lt "$best" ] && best=$n && gpu=$g
  done
  echo "$gpu" > "$W/$name.gpu"
  echo "$(date -u +%FT%TZ) start $name on GPU $gpu" >> "$W/timeline.txt"
  CUDA_VISIBLE_DEVICES=$gpu setsid nohup bash -c "($*) > '$W/$name.log' 2>&1 && end=done || end=failed; \
      touch '$W/$name.'\$end; echo \"\$(date -u +%FT%TZ) \$end $name\" >> '$W/timeline.txt'" \
      < /dev/null > /dev/null 2>&1 &
}
# model name: model file, recipe, elastic fine-tuning epochs
declare -A FILE=([r18]=cifar_resnet18 [r56]=cifar_resnet56 [mbv2]=cifar_mobilenetv2)
declare -A CFG=([r18]=elastify-cifar-resnet18-tied-200 [r56]=${R56_CONFIG:-elastify-cifar-resnet56-tied-140}
                [mbv2]=elastify-cifar-mobilenetv2-tied-100)
# the factory in the model file (its name tags the space: cifar_resnet56 for the shipped supernet)
declare -A FACTORY=([r18]=build [r56]=${R56_FACTORY:-build} [mbv2]=build)
declare -A EPOCHS=([r18]=${R18_EPOCHS:-50} [r56]=${R56_EPOCHS:-40} [mbv2]=${MBV2_EPOCHS:-30})
# specializations: name = model:selection[:epochs] (an id without the space tag, or "within:POINTS":
# the fewest MACs within POINTS of the original on validation). A kept block of a depth variant runs
# at inner width 0.75 (w75), not as the original's block: those are frozen (the original stays
# exact), so a variant of original blocks and skips has nothing to learn (specialize refuses it).
R56_15=e2.7S7S7S7S77S7S7S7S77S7S7S7S7  # 15 of 27 blocks (every other one skipped)
R56_12=e2.7S7S7SS7S7S7S7SS7S7S7S7SS7S  # 12 of 27 blocks
R56_9=e2.7SS7SS7SS7SS7SS7SS7SS7SS7SS   # 9 of 27 blocks (a ResNet-20's depth)
declare -A SPEC_LIST=(
  [r18-w50]=r18:e3.555555555555 [r18-w50x25]=r18:e3.522522522522 [r18-1pt]=r18:within:1
  [r18-w50-e80]=r18:e3.555555555555:80 [mbv2-d75-e80]=mbv2:e3.7B7S77S777S7S7S777S77B:80
  [r56-d15w75]=r56:$R56_15 [r56-d12w75]=r56:$R56_12 [r56-d9w75]=r56:$R56_9
  [mbv2-w75]=mbv2:e3.7B7777777777777777777B [mbv2-w50]=mbv2:e3.5B5555555555555555555B [mbv2-1pt]=mbv2:within:1
  [mbv2-d75]=mbv2:e3.7B7S77S777S7S7S777S77B  # 6 of the 10 skippable blocks skipped, the rest at 0.75
  [r18-w50-e200]=r18:e3.555555555555:200 [r18-w50x25-e200]=r18:e3.522522522522:200
  [r18-w50-e100]=r18:e3.555555555555:100 [r18-w50x25-e100]=r18:e3.522522522522:100
  [r56-d12w75-e100]=r56:$R56_12:100 [r56-w50-e100]=r56:e2.555555555555555555555555555:100
)
SPECS=${SPECS:-r18-w50 r56-d12w75 mbv2-w75 r18-w50x25 r56-d15w75 mbv2-d75 r56-d9w75 mbv2-w50 r18-w50-e80 mbv2-d75-e80}
for spec in $SPECS; do  # a spec is a name of SPEC_LIST or NAME=model:selection[:epochs]
  [ "${spec#*=}" != "$spec" ] && SPEC_LIST[${spec%%=*}]=${spec#*=}
done
SPECS=$(for spec in $SPECS; do echo "${spec%%=*}"; done)
for spec in $SPECS; do  # an unknown name or a malformed NAME=... would otherwise wait forever
  IFS=: read -r m how _ <<< "${SPEC_LIST[$spec]:-}"
  if [ -z "$m" ] || [ -z "${FILE[$m]:-}" ] || [ -z "$how" ]; then
    echo "gpu_specialize.sh: SPECS entry '$spec': expected a name of SPEC_LIST or NAME=MODEL:SELECTION[:EPOCHS]" \
         "with MODEL one of ${!FILE[*]} (got '${SPEC_LIST[$spec]:-}')" >&2
    exit 2
  fi
done
for m in ${MODELS:-r18 mbv2 r56}; do  # round-robin: on two GPUs the lighter R56 shares with R18
  bg "$m-elastic" python3 -m commands train-supernet --model "$M/${FILE[$m]}.py:${FACTORY[$m]}" \
      --weights "$W/$m.safetensors" --input-shape 1,3,32,32 --data "$DATA" --config "$C/${CFG[$m]}.json" \
      --finetune-epochs "${EPOCHS[$m]}" --eval-variants 6 --cache-dir "$W/cache-$m" --out "$W/$m-elastic" $EXTRA
done
spec_tag() {  # the space tag of a model's elastic supernet (the first arch id of its variants.csv)
  sed -n 2p "$W/$1-elastic/variants.csv" | cut -d. -f1
}
for spec in $SPECS; do
  IFS=: read -r m how arg options <<< "${SPEC_LIST[$spec]}"
  [ -f "$W/$m-elastic.done" ] || continue
  epochs=${SPEC_EPOCHS:-30}
  if [ "$how" = within ]; then pick="--front-within $arg"; else pick="--variants $how"; epochs=${arg:-$epochs}; fi
  bg "$spec" python3 -m commands specialize --supernet "$W/$m-elastic" $pick --epochs "$epochs" \
      --data "$DATA" --cache-dir "$W/cache-$m" --out "$W/$spec" $EXTRA ${SPEC_EXTRA:-} ${options//,/ } "&&" \
      python3 -m benchmarks.supernet.front --supernet "$W/$spec" --data "$DATA" --table-only --random 0 \
      --out "$W/$spec.csv" ${FRONT_EXTRA:-}
done
for m in ${MODELS:-r18 r56 mbv2}; do
  [ -f "$W/$m-elastic.done" ] || continue
  extra_archs=""  # the explicitly chosen variants, before specialization
  for spec in $SPECS; do
    IFS=: read -r sm how _ <<< "${SPEC_LIST[$spec]}"
    [ "$sm" = "$m" ] && [ "$how" != within ] && extra_archs="$extra_archs --arch $(spec_tag "$m").$how"
  done
  bg "$m-front" python3 -m benchmarks.supernet.front --supernet "$W/$m-elastic" --data "$DATA" \
      --random "${FRONT_RANDOM:-20}" $extra_archs --out "$W/$m-front.csv" ${FRONT_EXTRA:-}
done
sleep "${POLL_S:-0}"
for f in "$W"/*.log; do echo "== $(basename "$f"): $(tail -c 300 "$f" | tr '\r' '\n' | tail -n 1)"; done
pending=0
for name in $(for m in ${MODELS:-r18 r56 mbv2}; do echo "$m-elastic $m-front"; done) $SPECS; do
  [ -f "$W/$name.done" ] || [ -f "$W/$name.failed" ] || pending=1
done
if [ -n "${COLLECT:-}" ]; then  # the small files a summary needs (benchmarks/supernet/specialized.py)
  mkdir -p "$COLLECT"
  for d in "$W"/*/; do
    n=$(basename "$d")
    for f in history.json variants.csv manifest.json specialize.json; do
      [ -f "$d/$f" ] && cp "$d/$f" "$COLLECT/$n-$f"
    done
  done
  cp "$W"/*.csv "$W"/timeline.txt "$W"/machine.txt "$COLLECT"/ 2>/dev/null
  for f in "$W"/*.log; do tail -c 3000 "$f" > "$COLLECT/$(basename "$f").tail"; done
fi
[ "$pending" = 0 ] && echo "all done" && ls "$W"/*.failed 2>/dev/null
