#!/usr/bin/env bash
# Rerun a resumable GPU job script on the warm machine until it prints "all done" or WAIT_S
# seconds pass (default 20; one device call is limited to 10 minutes, and the machine is given
# back after 30 s idle, so calls follow each other back to back):
#   WAIT_S=540 bash scripts/gpu_poll.sh bash scripts/gpu_r18_cut.sh WORKDIR
# POLL_S (default 20) between reruns; the last rerun's output tail is printed, then the GPU's use.
set -uo pipefail
[ "$#" -gt 0 ] || { echo "usage: [WAIT_S=N] bash scripts/gpu_poll.sh COMMAND [ARGS...]" >&2; exit 2; }
end=$((SECONDS + ${WAIT_S:-20}))
while :; do
  out=$("$@" 2>&1)
  if echo "$out" | grep -q "all done" || [ "$SECONDS" -ge "$end" ]; then break; fi
  sleep "${POLL_S:-20}"
done
echo "$out" | tail -n "${TAIL_LINES:-25}"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || true
