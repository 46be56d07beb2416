#!/usr/bin/env bash
# Set up and run the default (fast, CPU) test suite; slow and GPU tests: -m slow / -m gpu.
# HMT_SKIP_SETUP=1 skips the set-up (.ci/run does it once for several runs).
# pytest's exit 5 ("no tests collected", e.g. -m gpu on a machine whose GPU tests are all
# deselected) is success here, with a note; HMT_ALLOW_NO_TESTS=0 (CI) makes it a failure,
# since there an empty selection means tests went missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${HMT_SKIP_SETUP:-0}" != "1" ]; then
    bash scripts/setup.sh
fi
rc=0
python3 -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    if [ "${HMT_ALLOW_NO_TESTS:-1}" = "1" ]; then
        echo "test.sh: pytest collected no tests for: ${*:-the default selection} (exit 5); nothing to run" >&2
        exit 0
    fi
    echo "test.sh: pytest collected no tests for: ${*:-the default selection} (exit 5); tests are missing" >&2
fi
exit "$rc"
