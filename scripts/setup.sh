#!/usr/bin/env bash
# Install hmt and everything its offline half needs into the current Python.
# CPU torch first and pinned (from PyTorch's CPU wheel index where it is reachable, see
# scripts/setup_torch.sh), so that no resolver pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_torch.sh
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "torch==2.13.0" -e ".[offline,dev,tune]"
# deploy cross-compiles TVM libraries for the Arm targets with Debian's aarch64 gcc. Best
# effort: installed only where apt works (root, or sudo without a password); setup never
# fails because of it (hmt deploy then says which package is missing).
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
    { $SUDO apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null 2>&1 \
        || { $SUDO apt-get update -qq >/dev/null 2>&1 && $SUDO apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null 2>&1; }; } \
        || echo "setup: gcc-aarch64-linux-gnu not installed (apt unavailable); hmt deploy for Arm targets needs it" >&2
fi
