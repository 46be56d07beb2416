"""The serve hook on a stream whose camera moves outdoors and back: clean -> corrupted -> clean.

    PYTHONPATH=$PWD python -m benchmarks.adapt.online --bn runs/r20pre-bn --data runs/cifar10-c \
        --corruption gaussian_noise-s5 --out benchmarks/adapt/online_r20pre_gaussian_s5.json

Torch-free (numpy + ONNX Runtime), as on the device: each request batch is answered by the
adapter's active variant (or the shipped one), then handed to ``OnlineBnAdapter.observe``.
Reports per phase the served accuracy against the shipped variant's, and the events
(drift start, adapted/refused, reset) with the input count at which they fired.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import Driver
from hmt.adapt.corruptions import load_shift_set
from hmt.adapt.guard import GuardPolicy
from hmt.adapt.online import OnlineBnAdapter
from hmt.data.cifar import CIFAR10_MEAN, CIFAR10_STD

BENCH = Driver(
    baseline="the shipped variant, unadapted, on the same stream",
    needs="a BN-adaptable bundle and a shift set (--bn, --data)",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bn", type=Path, required=True, help="bn-adaptable export (hmt adapt --export-bn)")
    parser.add_argument("--data", type=Path, required=True, help="shift set")
    parser.add_argument("--corruption", default="gaussian_noise-s5")
    parser.add_argument("--phase", type=int, default=1000, help="images per phase")
    parser.add_argument("--request-batch", type=int, default=16)
    parser.add_argument("--canary", type=int, default=0,
                        help="labelled images of the corrupted set (not in the stream) as the canary")
    parser.add_argument("--canary-only", action="store_true", help="the canary alone decides (no entropy rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    shift = load_shift_set(args.data, names=["clean", args.corruption])
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(shift.labels))
    shape = (1, -1, 1, 1)
    mean = np.asarray(CIFAR10_MEAN, np.float32).reshape(shape)
    std = np.asarray(CIFAR10_STD, np.float32).reshape(shape)
    phases = [("clean", order[:args.phase]), (args.corruption, order[args.phase:2 * args.phase]),
              ("clean", order[2 * args.phase:3 * args.phase])]
    canary = None
    if args.canary:
        held = order[3 * args.phase:3 * args.phase + args.canary]
        canary = ((shift.sets[args.corruption][held].astype(np.float32) / 255.0 - mean) / std, shift.labels[held])
    adapter = OnlineBnAdapter(args.bn, canary=canary,
                              guard=GuardPolicy(require_entropy_drop=not args.canary_only))
    shipped = adapter.reestimator.shipped()
    rows, events, observe_ms = [], [], []
    for name, idx in phases:
        served_ok = shipped_ok = 0
        for i in range(0, len(idx), args.request_batch):
            part = idx[i:i + args.request_batch]
            x = (shift.sets[name][part].astype(np.float32) / 255.0 - mean) / std
            y = shift.labels[part]
            active = adapter.active or shipped
            served_ok += int((active.run_last(x).argmax(1) == y).sum())
            shipped_ok += int((shipped.run_last(x).argmax(1) == y).sum())
            start = time.perf_counter()
            for event in adapter.observe(x):
                events.append({"kind": event.kind, "seen": event.seen, "detail": event.detail})
                print(f"{event.seen:5d} {event.kind}: {event.detail}", file=sys.stderr)
            observe_ms.append((time.perf_counter() - start) * 1e3)
        rows.append({"phase": name, "images": len(idx), "served_accuracy": served_ok / len(idx),
                     "shipped_accuracy": shipped_ok / len(idx)})
        print(f"{name:20s} served {served_ok / len(idx):.4f}  shipped only {shipped_ok / len(idx):.4f}",
              file=sys.stderr)
    report = {"command": " ".join(sys.argv), "phases": rows, "events": events,
              "observe_ms_median": float(np.median(observe_ms)), "observe_ms_max": float(np.max(observe_ms))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
