"""``hmt serve --adapt`` through real HTTP on a moving camera: served accuracy and request latency, adapt on vs off.

    PYTHONPATH=$PWD python3 scripts/make_corruptions.py --data ../shared/datasets/cifar10-jpeg --out runs/c-2k \\
        --corruption gaussian_noise --corruption defocus_blur --severity 5 --limit 2000
    PYTHONPATH=$PWD python -m benchmarks.adapt.serve_adapt --bundle runs/bundle-adaptable --data runs/c-2k \\
        --corruption defocus_blur-s5 --phase 1000 --reps 2 --out benchmarks/adapt/serve_defocus.json

Each run starts ``hmt serve`` in process (a real socket, uvicorn, one keep-alive client
sending uint8 pixels one image per request, as a camera would) with one variant fixed
(``--variant``, default the bundle's most accurate; early exit off) and sends, at
``--rate-hz`` (0: as fast as the server answers), three phases: ``--phase``
clean images, as many corrupted, as many clean again (disjoint images, shuffled with a
seed). Runs alternate adapt off / on, ``--reps`` times each. Reported per run and phase:
accuracy of the answers, request latency p50/p95 as the client saw it, the variant that
answered; for adapt on, the adaptation events with the input count they happened at.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import Driver
from hmt.adapt.corruptions import load_shift_set
from hmt.client import HmtClient
from hmt.serve.http.api import ApiOptions, create_app
from hmt.serve.http.server import ApiServer, ServerOptions
from hmt.serve.running.adapt import AdaptSettings
from hmt.serve.running.session import SessionOptions, open_controller


def run_once(bundle: Path, variant: str | None, phases: list[tuple[str, np.ndarray, np.ndarray]],
             adapt: AdaptSettings | None, threads: int, canary: Path | None = None,
             rate_hz: float = 0.0) -> dict[str, Any]:
    options = SessionOptions(fixed_variant=variant, threads=threads, adapt=adapt, no_early_exit=True,
                             canary=canary if adapt is not None else None)
    controller = open_controller(bundle, options)
    controller.start()
    server = ApiServer(create_app(controller, ApiOptions(workers=1)), ServerOptions(port=0))
    server.start_background()
    client = HmtClient(server.url, report_latency=False)
    rows = []
    seen = 0
    try:
        for name, images, labels in phases:
            latencies, correct, variants = [], 0, {}
            next_s = time.perf_counter()
            for image, label in zip(images, labels, strict=True):
                if rate_hz > 0:  # a camera: one frame every 1/rate s (open loop, no catching up in bursts)
                    next_s += 1.0 / rate_hz
                    time.sleep(max(0.0, next_s - time.perf_counter()))
                t0 = time.perf_counter()
                doc = client.predict(np.ascontiguousarray(image.transpose(1, 2, 0)))  # HWC uint8 pixels
                latencies.append((time.perf_counter() - t0) * 1e3)
                correct += int(doc["class"] == label)
                variants[doc["variant"]] = variants.get(doc["variant"], 0) + 1
            seen += len(labels)
            rows.append({"phase": name, "images": len(labels), "accuracy": correct / len(labels),
                         "latency_ms_p50": float(np.percentile(latencies, 50)),
                         "latency_ms_p95": float(np.percentile(latencies, 95)), "answered_by": variants})
        status = client.status()
    finally:
        client.close()
        server.stop_background()
        controller.stop()
    return {"adapt": adapt is not None, "phases": rows, "adapt_status": status.get("adapt"),
            "variant": status["variant"]}


BENCH = Driver(
    baseline="the same server with adapt off, runs alternating off / on",
    needs="an adaptable bundle and a shift set (--bundle, --data)",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="a bundle from hmt deploy --adaptable")
    parser.add_argument("--data", type=Path, required=True, help="a shift set (scripts/make_corruptions.py)")
    parser.add_argument("--corruption", required=True, help="the corrupted phase's set, e.g. defocus_blur-s5")
    parser.add_argument("--variant", default=None)
    parser.add_argument("--phase", type=int, default=1000, help="images per phase")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rate-hz", type=float, default=0.0, help="requests per second (0: as fast as answered)")
    parser.add_argument("--canary", type=int, default=0, help="labelled corrupted images held out as --canary")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    shift = load_shift_set(args.data, names=["clean", args.corruption])
    order = np.random.default_rng(0).permutation(len(shift.labels))
    need = 3 * args.phase + args.canary
    if len(order) < need:
        parser.error(f"{args.data} holds {len(order)} images; 3 phases of {args.phase} + canary need {need}")
    a, b, c = (order[k * args.phase:(k + 1) * args.phase] for k in range(3))
    phases = [("clean", shift.sets["clean"][a], shift.labels[a]),
              (args.corruption, shift.sets[args.corruption][b], shift.labels[b]),
              ("clean again", shift.sets["clean"][c], shift.labels[c])]
    if args.variant is None:
        from hmt.bundle import load_bundle

        args.variant = max(load_bundle(args.bundle).spec.variants, key=lambda v: v.accuracy).arch_id
    canary_path = None
    if args.canary:
        held = order[3 * args.phase:need]
        import tempfile

        # Derived images, not a result: beside the run, never in the output folder.
        canary_path = Path(tempfile.mkdtemp(prefix="hmt-canary-")) / "canary.npz"
        np.savez(canary_path, x=shift.sets[args.corruption][held].transpose(0, 2, 3, 1), y=shift.labels[held])
    adapt = AdaptSettings(require_entropy_drop=not args.canary, unguarded=not args.canary)
    runs = []
    load = os.getloadavg()
    for rep in range(args.reps):
        for on in (False, True):
            result = run_once(args.bundle, args.variant, phases, adapt if on else None, args.threads, canary_path,
                              args.rate_hz)
            result["rep"] = rep
            runs.append(result)
            print(json.dumps({"rep": rep, "adapt": on, "phases": result["phases"]}), file=sys.stderr, flush=True)
    report = {"command": " ".join(sys.argv), "bundle": str(args.bundle), "variant": args.variant,
              "load_average_start": load, "load_average_end": os.getloadavg(), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    for r in runs:
        cells = " | ".join(f"{100 * p['accuracy']:.1f}% {p['latency_ms_p50']:.2f}/{p['latency_ms_p95']:.2f} ms"
                           for p in r["phases"])
        print(f"| {r['rep']} | {'on' if r['adapt'] else 'off'} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
