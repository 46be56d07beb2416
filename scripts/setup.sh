#!/usr/bin/env bash
# Install hmt and everything its offline half needs into the current Python.
# CPU torch first and pinned, so that no resolver pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "torch==2.13.0" -e ".[offline,dev]"
