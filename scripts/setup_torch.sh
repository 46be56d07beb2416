#!/usr/bin/env bash
# Install the CPU build of torch, pinned, and say which build was installed.
#
# On a stock Linux x86-64 machine the default index (PyPI) serves the CUDA build of torch,
# with several GB of GPU wheels. PyTorch's CPU wheel index serves the CPU build: it is asked
# first; where it cannot be reached (an offline mirror, a proxy that only passes PyPI), the
# default index is used, and the line printed at the end says which build that gave.
#
# HMT_TORCH_CPU_INDEX: the CPU index (default PyTorch's); HMT_PIP: the pip command (tests).
set -euo pipefail
TORCH_VERSION="${HMT_TORCH_VERSION:-2.13.0}"
CPU_INDEX="${HMT_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
read -r -a PIP <<< "${HMT_PIP:-python3 -m pip}"
PIP_FLAGS=(--quiet --disable-pip-version-check --root-user-action=ignore)

if python3 - "$CPU_INDEX" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).close()
except Exception:
    sys.exit(1)
PY
then
    source="PyTorch's CPU wheel index ($CPU_INDEX)"
    # The CPU index carries torch's dependencies too; --index-url keeps a CUDA build out.
    "${PIP[@]}" install "${PIP_FLAGS[@]}" --index-url "$CPU_INDEX" "torch==$TORCH_VERSION"
else
    source="the default index ($CPU_INDEX is not reachable from here)"
    echo "setup: $CPU_INDEX is not reachable; installing torch $TORCH_VERSION from the default index" >&2
    "${PIP[@]}" install "${PIP_FLAGS[@]}" "torch==$TORCH_VERSION"
fi
python3 - "$source" <<'PY'
import sys
import torch
cuda = torch.version.cuda
build = "CPU build" if cuda is None else f"CUDA {cuda} build"
print(f"setup: torch {torch.__version__} installed, {build}, from {sys.argv[1]}")
if cuda is not None:
    print("setup: this torch carries GPU libraries; for the CPU build: "
          "pip install --index-url https://download.pytorch.org/whl/cpu torch", file=sys.stderr)
PY
