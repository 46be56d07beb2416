"""Client-side latency through tritonclient on /v2 against hmt.client on /v1, one keep-alive client.

The same input, one request at a time, each client on its own kept-alive connection; the three
paths (``/v1`` .npy through :class:`hmt.client.HmtClient` as the baseline, ``/v2`` binary tensors
and ``/v2`` JSON tensors through ``tritonclient.http``) alternate in bursts within each
repetition, and the medians of the repetitions' p50/p99 are reported.

    python -m benchmarks.protocol.latency [--quick] [--requests 400] [--reps 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.protocol.common import ServeProcess, make_bundle, median_of, percentiles_ms, write_result

WIDTH, DEPTH = 256, 2


def run(argv: list[str]) -> Path:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol.latency")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--requests", type=int, default=400, help="requests per path per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.reps = 40, 2
    import tritonclient.http as triton

    from hmt.client import HmtClient

    x = np.random.default_rng(args.seed).standard_normal((1, WIDTH)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp) / "bundle", WIDTH, DEPTH, seed=args.seed)
        with ServeProcess(bundle, ["--workers", "1"]) as server:
            v1 = HmtClient(server.url, report_latency=False)
            v2 = triton.InferenceServerClient(url=server.url.removeprefix("http://"))

            def call_v1() -> None:
                v1.predict(x)

            def v2_call(binary: bool) -> Any:
                tensor = triton.InferInput("input", [1, WIDTH], "FP32")
                tensor.set_data_from_numpy(x, binary_data=binary)
                outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("class", "confidence")]
                return lambda: v2.infer("bench", [tensor], outputs=outputs)

            paths = {"v1_npy_hmt_client": call_v1, "v2_binary_tritonclient": v2_call(True),
                     "v2_json_tritonclient": v2_call(False)}
            reference = v1.predict(x)["class"]
            assert int(paths["v2_binary_tritonclient"]().as_numpy("class")[0]) == reference
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
            for rep in range(args.reps):
                for name in list(paths)[rep % 3:] + list(paths)[:rep % 3]:
                    call = paths[name]
                    for _ in range(10):  # warm the connection and the path
                        call()
                    samples = []
                    for _ in range(args.requests):
                        t0 = time.perf_counter()
                        call()
                        samples.append(time.perf_counter() - t0)
                    runs[name].append(percentiles_ms(samples))
            v1.close()
            v2.close()
    results = {name: {"p50_ms_median": median_of(r, "p50"), "p99_ms_median": median_of(r, "p99"),
                      "repetitions": r} for name, r in runs.items()}
    base = results["v1_npy_hmt_client"]
    claims = [{"claim": f"{name} against /v1 (hmt.client, .npy), one keep-alive client, median of {args.reps} reps",
               "figure": f"p50 {r['p50_ms_median']:.3f} ms vs {base['p50_ms_median']:.3f} ms; "
                         f"p99 {r['p99_ms_median']:.3f} ms vs {base['p99_ms_median']:.3f} ms"}
              for name, r in results.items() if name != "v1_npy_hmt_client"]
    return write_result("latency", args.quick, argv, args.seed,
                        "/v1/predict through hmt.client (keep-alive, .npy body) on the same server, same input, "
                        "alternating with the /v2 paths in each repetition", {
                            "model": {"width": WIDTH, "depth_per_segment": DEPTH, "segments": 2, "workers": 1},
                            "requests_per_path_per_rep": args.requests, "reps": args.reps, "paths": results},
                        claims)


if __name__ == "__main__":
    print(run(sys.argv[1:]))
