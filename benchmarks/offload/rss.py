"""Memory of ``hmt serve DEVICE_BUNDLE --peer URL`` once started: resident set and ONNX Runtime sessions.

Opens the device as the command does (:func:`hmt.offload.session.open_device`: the serve
controller and the offload device), starts the controller without its background loop
(it loads and warms the variants it preloads) and reports, per fresh process, the RSS
before and after and the number of live ``onnxruntime.InferenceSession`` objects. The peer
URL points at nothing: no request is sent.

    python -m benchmarks.offload.rss --bundle runs/ship/offload/device --reps 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.harness import Driver, child_env


def measure(bundle: Path) -> dict[str, float]:
    import gc

    import psutil

    proc = psutil.Process()
    import onnxruntime

    from hmt.offload.session import PeerLink, open_device
    from hmt.serve.running.session import SessionOptions

    before = proc.memory_info().rss
    wrapped = open_device(bundle, SessionOptions(), PeerLink("http://127.0.0.1:9"), deadline_ms=100.0)
    wrapped._controller.start(background=False)  # the preload, without the loop thread
    gc.collect()
    after = proc.memory_info().rss
    sessions = sum(isinstance(o, onnxruntime.InferenceSession) for o in gc.get_objects())
    return {"rss_mb_before": before / 2**20, "rss_mb_after": after / 2**20, "rss_mb_added": (after - before) / 2**20,
            "ort_sessions": sessions, "pool_loaded": len(wrapped._controller.pool.loaded_ids()),
            "device_chains": len(wrapped.device.chains)}


BENCH = Driver(
    baseline="the resident set before the controller starts, in the same fresh process",
    needs="a device bundle (hmt deploy --offload-out; --bundle)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="the device bundle (hmt deploy --offload-out)")
    parser.add_argument("--reps", type=int, default=3, help="fresh processes")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (JSON)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.bundle)))
        return
    runs = []
    for _ in range(args.reps):
        out = subprocess.run([sys.executable, __file__, "--bundle", str(args.bundle), "--one"], check=True,
                             capture_output=True, text=True, env=child_env()).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    summary = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    report = {"runs": runs, "median": summary}
    print(json.dumps(report, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
