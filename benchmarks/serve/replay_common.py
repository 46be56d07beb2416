"""What the scenario-replay benchmarks share: inputs, a synthetic bundle for quick runs, calibration.

- :func:`export_cifar`: the embedded CIFAR-10 test images, normalised as in training, as an .npz;
- :func:`synthetic_bundle`: a bundle of MatMul chains of growing depth (real ONNX Runtime compute,
  no training), for the ``--quick`` paths that must finish in well under a minute;
- :func:`calibrate_ms`: the largest variant's server-side p95, unloaded, through the API (the
  budget is a factor of it).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from hmt.errors import InputError
from hmt.serve.http.api import ApiOptions
from hmt.serve.http.server import ServerOptions
from hmt.serve.running.scenario import DriveOptions, Scenario
from hmt.serve.running.session import SessionOptions, run_scenario

# The API every replay serves through: the queue, workers and request deadline of the matrix's runs.
REPLAY_API = ApiOptions(max_queue=64, workers=2, deadline_ms=2000.0)

# Synthetic variants: (arch_id, accuracy, MatMul layers per segment); each layer is 384 x 384.
SYNTHETIC = (("s2", 0.80, 1), ("s4", 0.85, 3), ("s8", 0.89, 7), ("s16", 0.92, 14))
SYNTHETIC_WIDTH = 384


def export_cifar(path: Path, limit: int | None = None) -> Path:
    """The embedded CIFAR-10 test split, normalised as in training: an .npz with x and y."""
    from hmt.data.load import load_dataset

    data = load_dataset("cifar10")
    mean = np.asarray(data.info.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(data.info.std, dtype=np.float32).reshape(1, -1, 1, 1)
    x = ((data.test_x.astype(np.float32) / 255.0 - mean) / std).astype(np.float32)
    y = data.test_y.astype(np.int64)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    np.savez(path, x=x, y=y)
    return path


def synthetic_bundle(out: Path, seed: int = 0) -> Path:
    """A bundle of :data:`SYNTHETIC` variants: two segments of MatMul + Relu layers each, exits to 10
    classes; latencies in bundle.json are measured here (median of 20 runs), accuracies are the table's."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from hmt.artifacts import ArtifactWriter
    from hmt.pareto.index import FrontIndex, IndexEntry

    rng = np.random.default_rng(seed)
    width, classes = SYNTHETIC_WIDTH, 10

    def model(nodes: list[Any], src: str, dst: str, n_out: int, inits: list[Any]) -> bytes:
        m = helper.make_model(helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info(src, TensorProto.FLOAT, [1, width])],
            [helper.make_tensor_value_info(dst, TensorProto.FLOAT, [1, n_out])], inits),
            opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m.SerializeToString()

    def spec(name: str, n: int) -> dict[str, Any]:
        return {"name": name, "shape": [1, n], "dtype": "float32"}

    def timed_ms(graphs: list[bytes]) -> float:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sessions = [ort.InferenceSession(g, options, providers=["CPUExecutionProvider"]) for g in graphs]
        x = rng.standard_normal((1, width)).astype(np.float32)
        import time

        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            y = x
            for s in sessions:
                y = s.run(None, {s.get_inputs()[0].name: y})[0]
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    entries, index = [], []
    with ArtifactWriter(out, kind="bundle", config={"benchmark": "serve replay, synthetic"}) as writer:
        for arch_id, accuracy, depth in SYNTHETIC:
            segments, exits, graphs = [], [], []
            for k in range(2):
                src = "input" if k == 0 else f"features_{k - 1}"
                nodes, inits, last = [], [], src
                for i in range(depth):
                    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
                    inits.append(numpy_helper.from_array(w, f"w{i}"))
                    nodes += [helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]),
                              helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
                    last = f"r{i}"
                nodes.append(helper.make_node("Identity", [last], [f"features_{k}"]))
                segment = model(nodes, src, f"features_{k}", width, inits)
                head_w = numpy_helper.from_array(rng.standard_normal((width, classes)).astype(np.float32), "h")
                head = model([helper.make_node("MatMul", [f"features_{k}", "h"], [f"logits_{k}"])],
                             f"features_{k}", f"logits_{k}", classes, [head_w])
                writer.write_bytes(f"variants/{arch_id}/segment_{k}.onnx", segment)
                writer.write_bytes(f"variants/{arch_id}/exit_{k}.onnx", head)
                graphs.append(segment)
                segments.append({"index": k, "input": spec(src, width), "output": spec(f"features_{k}", width),
                                 "onnx": f"variants/{arch_id}/segment_{k}.onnx"})
                exits.append({"index": k, "input": spec(f"features_{k}", width),
                              "output": spec(f"logits_{k}", classes), "onnx": f"variants/{arch_id}/exit_{k}.onnx",
                              "consumes_segment": k})
            latency_ms = timed_ms([*graphs, head])
            memory_mb = 2 * depth * width * width * 4 / 1e6
            per_exit = (accuracy - 0.1, accuracy)
            entries.append({"arch_id": arch_id, "exit_stage": 1, "accuracy": accuracy,
                            "accuracy_per_exit": list(per_exit), "latency_ms": latency_ms, "energy": latency_ms,
                            "memory_mb": memory_mb, "segments": segments, "exits": exits,
                            "preferred_engine": "onnxruntime", "engines": ["onnxruntime"]})
            index.append(IndexEntry(arch_id, accuracy, latency_ms, latency_ms, memory_mb, 1, per_exit,
                                    "onnxruntime"))
        writer.write_json("bundle.json", {"version": 1, "target": {"name": "host"}, "classes": classes,
                                          "input": spec("input", width), "variants": entries})
        writer.write_json("profile.json", {"device": "benchmark"})
        writer.write_json("index.json", FrontIndex(index).to_json_dict())
        # No early exit: every request runs the variant's last exit (the table accuracy is its own).
        writer.write_json("serve.json", {"early_exit": {"enabled": False}})
    return out


def calibrate_ms(bundle: Path, largest: str, data: Path | None, *, engine: str, rate_hz: float, clients: int,
                 seconds: float = 4.0, client_mode: str = "threads") -> float:
    """The server-side p95 of ``largest`` alone, unloaded, through the API."""
    result = run_scenario(bundle, Scenario.from_text("time_s\n0\n"),
                          SessionOptions(engine=engine, fixed_variant=largest),
                          DriveOptions(duration_s=seconds, clients=clients, rate_hz=rate_hz, client_mode=client_mode),
                          api=REPLAY_API, server=ServerOptions(port=0),
                          data=data, rng=np.random.default_rng(0), label="calibration")
    latency = result.summary["latency_ms"]
    if latency is None:
        raise InputError(f"calibration of {largest} answered no request")
    return float(latency["p95"])


def machine_details() -> dict[str, Any]:
    """Library versions beside the harness's machine record."""
    import onnxruntime

    return {"logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
            "shared": "a shared 2-core machine: other developers' jobs ran at the same time"}
