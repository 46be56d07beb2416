#!/usr/bin/env bash
# The shipped supernet's recipe on one GPU (hmt/data/embedded/supernet-cifar-resnet56/PROVENANCE.md): the
# pretrained ResNet-56 fine-tuned to this data (scripts/gpu_originals.sh ... r56 makes WORKDIR/r56.safetensors),
# elastified through the user path with the shipped space (benchmarks/supernet/configs/shipped-cifar-resnet56.json:
# w75 and skip, 1,024 calibration images, no elastic fine-tuning epochs), then VARIANTS specialized together.
# Resumable like scripts/gpu_specialize.sh, which it calls: rerun on the same warm machine until "all done".
#   bash scripts/gpu_shipped.sh WORKDIR        (WORKDIR holds cifar10.blob and r56.safetensors)
# Then, back on the build machine: python scripts/ship_supernet.py WORKDIR/shipped hmt/data/embedded/supernet-cifar-resnet56
# Knobs: VARIANTS (comma-separated ids; default the 12-block variant that ships), EPOCHS (120), LR (0.1).
# The supernet shipped before 2026-12-06 (the preset cifar-resnet56 with shared weights) is made by
#   hmt train-supernet --preset cifar-resnet56 --pretrained resnet56-4bfd9763.th --data CIFAR10_JPEG --out OUT
set -uo pipefail
W=$1
VARIANTS=${VARIANTS:-e2.7S7S7SS7S7S7S7SS7S7S7S7SS7S}
MODELS=r56 GPUS=${GPUS:-0} R56_EPOCHS=0 R56_CONFIG=shipped-cifar-resnet56 R56_FACTORY=${R56_FACTORY:-build} \
  SPECS="shipped=r56:$VARIANTS:${EPOCHS:-120}:--lr=${LR:-0.1}" SPEC_EXTRA="" FRONT_RANDOM=0 \
  bash scripts/gpu_specialize.sh "$W"
