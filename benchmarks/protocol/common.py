"""What the protocol benchmarks share: the bundle they serve, a serve process, timing helpers, the result file."""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
AREA = "protocol"


def make_bundle(out: Path, width: int, depth: int, classes: int = 10, seed: int = 0) -> Path:
    """A two-segment bundle whose graphs take a batch (symbolic first axis; bundle.json says 1):
    each segment is ``depth`` x (MatMul width x width, Relu), each exit a MatMul to ``classes``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from hmt.artifacts import ArtifactWriter
    from hmt.pareto.index import FrontIndex, IndexEntry

    rng = np.random.default_rng(seed)

    def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> bytes:
        m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m.SerializeToString()

    def tensor(name: str, n: int) -> Any:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", n])

    def spec(name: str, n: int) -> dict[str, Any]:
        return {"name": name, "shape": [1, n], "dtype": "float32"}

    segments, exits = [], []
    with ArtifactWriter(out, kind="bundle", config={"benchmark": "protocol"}) as writer:
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
            writer.write_bytes(f"variants/v/segment_{k}.onnx",
                               model(nodes, [tensor(src, width)], [tensor(f"features_{k}", width)], inits))
            head = numpy_helper.from_array(rng.standard_normal((width, classes)).astype(np.float32), "h")
            writer.write_bytes(f"variants/v/exit_{k}.onnx", model(
                [helper.make_node("MatMul", [f"features_{k}", "h"], [f"logits_{k}"])],
                [tensor(f"features_{k}", width)], [tensor(f"logits_{k}", classes)], [head]))
            segments.append({"index": k, "input": spec(src, width), "output": spec(f"features_{k}", width),
                             "onnx": f"variants/v/segment_{k}.onnx"})
            exits.append({"index": k, "input": spec(f"features_{k}", width), "output": spec(f"logits_{k}", classes),
                          "onnx": f"variants/v/exit_{k}.onnx", "consumes_segment": k})
        writer.write_json("bundle.json", {
            "version": 1, "target": {"name": "host"}, "classes": classes, "input": spec("input", width),
            "variants": [{"arch_id": "v", "exit_stage": 1, "accuracy": 0.9, "accuracy_per_exit": [0.85, 0.9],
                          "latency_ms": 1.0, "energy": 1.0, "memory_mb": 1.0, "segments": segments, "exits": exits,
                          "preferred_engine": "onnxruntime", "engines": ["onnxruntime"]}]})
        writer.write_json("profile.json", {"device": "benchmark"})
        writer.write_json("index.json", FrontIndex([IndexEntry("v", 0.9, 1.0, 1.0, 1.0, 1, (0.85, 0.9),
                                                               "onnxruntime")]).to_json_dict())
        # Early exit off: every request runs the whole chain (the same work whatever the input).
        writer.write_json("serve.json", {"early_exit": {"enabled": False}, "estimates": {"probe_share": 0.0}})
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServeProcess:
    """``python -m commands serve BUNDLE`` in its own process, on loopback, until closed (SIGTERM)."""

    def __init__(self, bundle: Path, extra: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.command = [sys.executable, "-m", "commands", "serve", str(bundle), "--port", str(self.port),
                        "--model-name", "bench", *extra]
        self.process = subprocess.Popen(self.command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {self.process.communicate()[1][-2000:]}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("serve was not ready within 120 s")
            time.sleep(0.2)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/v1/status", timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def percentiles_ms(samples_s: Sequence[float]) -> dict[str, float]:
    values = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)),
            "p99": float(np.percentile(values, 99)), "count": int(values.size)}


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
            "note": "a development machine shared with other developers' jobs: timings are noisy"}


def revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_result(name: str, quick: bool, argv: Sequence[str], seed: int, baseline: str, results: dict[str, Any],
                 claims: list[dict[str, str]]) -> Path:
    doc = {"area": AREA, "name": name, "command": " ".join(["python", "-m", f"benchmarks.{AREA}.{name}", *argv]),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "revision": revision(),
           "machine": machine(), "seed": seed, "quick": quick, "baseline": baseline, "results": results,
           "claims": claims}
    out_dir = Path(tempfile.mkdtemp(prefix=f"hmt-bench-{name}-")) if quick else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return path
