"""Tiny deploy bundles for the serve tests, built with onnx.helper (the tests may import onnx; serve may not).

Every variant has input ``input`` [1, 4] float32. Segment k is ``y = relu(x) * gain``
(``gain`` = 1 by default; a variant's ``work`` repeats a MatMul to make it slower). Exit
head k is ``logits = y @ W`` with W mapping feature j to class j (4 classes): an input
like [8, 0, 0, 0] answers class 0 with confidence ~0.999 at exit 0; [0, 0, 0, 0] is
uniform (confidence 0.25) and goes on to the last exit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hmt.artifacts import ArtifactWriter
from hmt.pareto.index import FrontIndex, IndexEntry

CLASSES = 4
# Switching without patience or dwell, for tests that watch the loop react (imported from here, not from
# conftest: a module named conftest is one per process, and tests/offload has its own).
FAST_SWITCH = {"switch": {"min_dwell_s": 0.0, "violation_patience": 1, "improve_patience": 1}}
WIDTH = 4


@dataclass
class VariantDef:
    arch_id: str
    accuracy: float
    latency_ms: float
    memory_mb: float
    energy: float = 1.0
    stages: int = 2
    work: int = 0  # extra MatMuls per segment (real compute, for timing tests)
    broken: bool = False  # write a corrupt segment_0 (a load that fails)
    slow_n: int = 0  # segment_0 also multiplies two n x n matrices built from the input (real, unfoldable work)
    accuracy_per_exit: list[float] = field(default_factory=list)
    runtime: dict[str, Any] | None = None  # fuse's choice (bundle.json extra.runtime, hmt.runtime.variant)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def segment_onnx(k: int, work: int, slow_n: int = 0, batch: int | str = 1) -> bytes:
    x = helper.make_tensor_value_info(f"features_{k - 1}" if k else "input", TensorProto.FLOAT, [batch, WIDTH])
    y = helper.make_tensor_value_info(f"features_{k}", TensorProto.FLOAT, [batch, WIDTH])
    nodes = [helper.make_node("Relu", [x.name], ["r0"])]
    inits = [numpy_helper.from_array(np.eye(WIDTH, dtype=np.float32), "eye")]
    last = "r0"
    if slow_n:
        # (sum(x) + 1) expanded to n x n, squared by MatMul, times 0: input-dependent, so never folded.
        inits += [numpy_helper.from_array(np.array([slow_n, slow_n], dtype=np.int64), "nn"),
                  numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")]
        nodes += [helper.make_node("ReduceSum", ["r0"], ["s0"], keepdims=0),
                  helper.make_node("Expand", ["s0", "nn"], ["a0"]),
                  helper.make_node("MatMul", ["a0", "a0"], ["b0"]),
                  helper.make_node("ReduceMean", ["b0"], ["c0"], keepdims=0),
                  helper.make_node("Mul", ["c0", "zero"], ["d0"]),
                  helper.make_node("Add", ["r0", "d0"], ["slow"])]
        last = "slow"
    for i in range(work):
        nodes.append(helper.make_node("MatMul", [last, "eye"], [f"m{i}"]))
        last = f"m{i}"
    nodes.append(helper.make_node("Identity", [last], [y.name]))
    return _model(nodes, [x], [y], inits)


def exit_onnx(k: int, batch: int | str = 1) -> bytes:
    x = helper.make_tensor_value_info(f"features_{k}", TensorProto.FLOAT, [batch, WIDTH])
    y = helper.make_tensor_value_info(f"logits_{k}", TensorProto.FLOAT, [batch, CLASSES])
    w = numpy_helper.from_array(np.eye(WIDTH, CLASSES, dtype=np.float32), "w")
    return _model([helper.make_node("MatMul", [x.name, "w"], [y.name])], [x], [y], [w])


def _graph(kind: str, arch_id: str, k: int) -> dict[str, Any]:
    feat_in = f"features_{k - 1}" if k else "input"
    if kind == "segment":
        return {"index": k, "input": {"name": feat_in, "shape": [1, WIDTH], "dtype": "float32"},
                "output": {"name": f"features_{k}", "shape": [1, WIDTH], "dtype": "float32"},
                "onnx": f"variants/{arch_id}/segment_{k}.onnx"}
    return {"index": k, "input": {"name": f"features_{k}", "shape": [1, WIDTH], "dtype": "float32"},
            "output": {"name": f"logits_{k}", "shape": [1, CLASSES], "dtype": "float32"},
            "onnx": f"variants/{arch_id}/exit_{k}.onnx", "consumes_segment": k}


DEFAULT_VARIANTS = (
    VariantDef("big", 0.92, 4.0, 4.0, energy=40.0),
    VariantDef("mid", 0.88, 2.0, 2.0, energy=20.0),
    VariantDef("small", 0.80, 1.0, 1.0, energy=10.0),
)


def make_bundle(out: Path, variants: tuple[VariantDef, ...] | list[VariantDef] = DEFAULT_VARIANTS,
                serve: dict[str, Any] | None = None, target: dict[str, Any] | None = None,
                dynamic_batch: bool = False, energy_unit: str = "mJ") -> Path:
    """``dynamic_batch``: the graphs take a batch (their first axis is symbolic, bundle.json still says 1);
    ``energy_unit``: the front's energy unit in index.json ("mac_equivalent": from an uncalibrated profile)."""
    batch: int | str = "N" if dynamic_batch else 1
    entries = []
    index_entries = []
    with ArtifactWriter(out, kind="bundle", config={"test": True}) as writer:
        for v in variants:
            per_exit = v.accuracy_per_exit or [v.accuracy - 0.05 * (v.stages - 1 - k) for k in range(v.stages)]
            for k in range(v.stages):
                data = segment_onnx(k, v.work, v.slow_n if k == 0 else 0, batch)
                writer.write_bytes(f"variants/{v.arch_id}/segment_{k}.onnx", b"garbage" if v.broken and k == 0
                                   else data)
                writer.write_bytes(f"variants/{v.arch_id}/exit_{k}.onnx", exit_onnx(k, batch))
            entries.append({
                "arch_id": v.arch_id, "exit_stage": v.stages - 1, "accuracy": v.accuracy,
                "accuracy_per_exit": per_exit, "latency_ms": v.latency_ms, "energy": v.energy,
                "memory_mb": v.memory_mb, "segments": [_graph("segment", v.arch_id, k) for k in range(v.stages)],
                "exits": [_graph("exit", v.arch_id, k) for k in range(v.stages)],
                "preferred_engine": "onnxruntime", "engines": ["onnxruntime"],
                **({"extra": {"runtime": v.runtime}} if v.runtime is not None else {}),
            })
            index_entries.append(IndexEntry(v.arch_id, v.accuracy, v.latency_ms, v.energy, v.memory_mb,
                                            v.stages - 1, tuple(per_exit), "onnxruntime"))
        writer.write_json("bundle.json", {
            "version": 1, "target": target or {"name": "host"}, "classes": CLASSES,
            "input": {"name": "input", "shape": [1, WIDTH], "dtype": "float32"}, "variants": entries})
        writer.write_json("profile.json", {"device": "test"})
        units = {"accuracy": "fraction", "latency_ms": "ms", "energy": energy_unit, "memory_mb": "MB"}
        writer.write_json("index.json", FrontIndex(index_entries, units=units).to_json_dict())
        writer.write_json("serve.json", serve if serve is not None else {})
    return out


def npy_bytes(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def dump(obj: Any) -> str:
    return json.dumps(obj)


def sleepy_loader(bundle: Any, sleep_s: float) -> Any:
    """A pool loader whose runners sleep ``sleep_s`` in segment 0 (a slow model without big graphs)."""
    import time

    from hmt.serve.running.runner import ChainRunner

    def load(arch_id: str) -> ChainRunner:
        variant = bundle.spec.variant(arch_id)
        n = variant.exit_stage + 1

        def slow(x: np.ndarray) -> np.ndarray:
            time.sleep(sleep_s)
            return np.maximum(x, 0)

        def head(x: np.ndarray) -> np.ndarray:
            return x.reshape(1, -1)[:, :CLASSES] @ np.eye(CLASSES, dtype=np.float32)

        segments = [slow] + [lambda x: np.maximum(x, 0)] * (n - 1)
        return ChainRunner(variant, segments, [head] * n, "onnxruntime")

    return load


def linear_bundle(out: Path, input_shape: list[int], extra_spec: dict[str, Any], seed: int = 0) -> Path:
    """One variant, one stage: flatten ``input_shape`` -> a fixed random [features, CLASSES] matmul ->
    an identity head; ``extra_spec`` goes into bundle.json (preprocess, class names)."""
    features = int(np.prod(input_shape[1:]))
    weights = np.random.default_rng(seed).standard_normal((features, CLASSES)).astype(np.float32)

    def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> bytes:
        graph = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                                  opset_imports=[helper.make_opsetid("", 17)])
        graph.ir_version = 8
        onnx.checker.check_model(graph)
        return bytes(graph.SerializeToString())

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)
    f = helper.make_tensor_value_info("features_0", TensorProto.FLOAT, [1, CLASSES])
    segment = model([helper.make_node("Flatten", ["input"], ["flat"], axis=1),
                     helper.make_node("MatMul", ["flat", "w"], ["features_0"])], [x], [f],
                    [numpy_helper.from_array(weights, "w")])
    y = helper.make_tensor_value_info("logits_0", TensorProto.FLOAT, [1, CLASSES])
    head = model([helper.make_node("MatMul", ["features_0", "eye"], ["logits_0"])], [f], [y],
                 [numpy_helper.from_array(np.eye(CLASSES, dtype=np.float32), "eye")])
    tensor = {"name": "input", "shape": input_shape, "dtype": "float32"}
    features_spec = {"name": "features_0", "shape": [1, CLASSES], "dtype": "float32"}
    graph = {"index": 0, "onnx": "variants/v/segment_0.onnx", "input": tensor, "output": features_spec}
    exit_graph = {"index": 0, "onnx": "variants/v/exit_0.onnx", "consumes_segment": 0, "input": features_spec,
                  "output": {"name": "logits_0", "shape": [1, CLASSES], "dtype": "float32"}}
    with ArtifactWriter(out, kind="bundle", config={"test": True}) as writer:
        writer.write_bytes("variants/v/segment_0.onnx", segment)
        writer.write_bytes("variants/v/exit_0.onnx", head)
        writer.write_json("bundle.json", {
            "version": 1, "target": {"name": "host"}, "classes": CLASSES, **extra_spec, "input": tensor,
            "variants": [{"arch_id": "v", "exit_stage": 0, "accuracy": 0.9, "accuracy_per_exit": [0.9],
                          "latency_ms": 1.0, "energy": 1.0, "memory_mb": 1.0, "segments": [graph],
                          "exits": [exit_graph], "preferred_engine": "onnxruntime", "engines": ["onnxruntime"]}]})
        writer.write_json("profile.json", {"device": "test"})
        writer.write_json("index.json", FrontIndex([IndexEntry("v", 0.9, 1.0, 1.0, 1.0, 0, (0.9,),
                                                               "onnxruntime")]).to_json_dict())
        writer.write_json("serve.json", {**FAST_SWITCH, "early_exit": {"enabled": False}})
    return out


def started_server(command: list[str], *, cwd: Path, env: dict[str, str] | None = None,
                   timeout_s: float = 60.0) -> tuple[Any, list[str], str]:
    """Start a serve command line in a process (stderr read into a list of lines as it comes), wait until
    it says where it listens and answers ready: (process, stderr lines, base URL)."""
    import re
    import subprocess
    import threading
    import time

    from hmt.client import HmtClient

    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    port = None
    while port is None and time.monotonic() < deadline and proc.poll() is None:
        port = next((m.group(1) for m in map(re.compile(r"127\.0\.0\.1:(\d+)").search, list(lines)) if m), None)
        time.sleep(0.1)
    if port is None:
        proc.kill()
        raise AssertionError("the server never said where it listens:\n" + "".join(lines)[-3000:])
    url = f"http://127.0.0.1:{port}"
    with HmtClient(url) as client:
        while not client.health()["ready"]:
            if time.monotonic() >= deadline:
                proc.kill()
                raise AssertionError("never ready:\n" + "".join(lines)[-3000:])
            time.sleep(0.1)
    return proc, lines, url
