#!/usr/bin/env bash
# Set up and run the default (fast, CPU) test suite; slow and GPU tests: -m slow / -m gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pytest "$@"
