"""Helpers of the hostile battery (:mod:`benchmarks.reliability.hostile`): served processes, requests, bundles."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TOKEN = "h" * 32


# -- helpers -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cpu": model, "logical_cpus": os.cpu_count(), "os": platform.platform(terse=True),
            "python": platform.python_version(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "note": "shared with other developers' jobs (about 6 at once); compare figures of one run only"}


def revision() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"


def _import_file(name: str, path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Served:
    """``hmt serve ...`` in its own process; ``url`` once it listens; stderr bytes counted."""

    def __init__(self, args: list[str], *, fd_limit: int | None = None, env: dict[str, str] | None = None,
                 timeout_s: float = 180.0) -> None:
        def limit() -> None:
            if fd_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        full_env = {**os.environ, "PYTHONPATH": str(REPO), "HMT_SERVE_TOKEN": TOKEN, **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "commands", "serve", *args, "--port", "0", "--json"],
                                     cwd=REPO, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     preexec_fn=limit)
        assert self.proc.stderr is not None
        self.log_bytes = 0
        self.head = b""
        deadline = time.monotonic() + timeout_s
        url = None
        while url is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"serve exited ({self.proc.poll()}): {self.head[-2000:]!r}")
            self.head += line
            found = re.search(rb" on (https?://[^\s,]+)", line)
            if found and b"serving" in line:
                url = found.group(1).decode()
            if time.monotonic() > deadline:
                raise RuntimeError("serve did not start")
        self.url = url
        self.port = int(url.rsplit(":", 1)[1])
        threading.Thread(target=self._drain, daemon=True).start()
        while http(self.port, "GET", "/v1/health/ready", timeout_s=5)[0] != 200:  # warm, a variant loaded
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"serve did not become ready (exit {self.proc.poll()})")
            time.sleep(0.1)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        while chunk := self.proc.stderr.read1(1 << 16):  # type: ignore[attr-defined]
            self.log_bytes += len(chunk)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def served(args: list[str], **kwargs: Any) -> Iterator[Served]:
    server = Served(args, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def http(port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout_s: float = 30.0, token: bool = True) -> tuple[int, bytes, float]:
    """One request on a fresh connection: (status, body, ms); status 0 for a transport failure."""
    import http.client

    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {TOKEN}"
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        data = response.read()
        return response.status, data, (time.perf_counter() - start) * 1e3
    except (OSError, http.client.HTTPException):
        return 0, b"", (time.perf_counter() - start) * 1e3
    finally:
        conn.close()


def npy(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, x, allow_pickle=False)
    return buffer.getvalue()


def npy_claiming(shape: tuple[int, ...], payload: bytes, descr: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + payload


def png(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image

    color = tuple(int(v) for v in np.random.default_rng(seed).integers(0, 255, 3))
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def tally(outcomes: list[tuple[str, int, bytes]]) -> dict[str, Any]:
    kinds = Counter("4xx" if 400 <= s < 500 else "5xx" if s >= 500 else "2xx" if 200 <= s < 300 else "transport"
                    for _, s, _ in outcomes)
    leaks = [name for name, s, body in outcomes if s >= 500 and re.search(rb"Error|Exception|Traceback", body)]
    return {"requests": len(outcomes), "got_4xx": kinds["4xx"], "got_5xx": kinds["5xx"], "got_2xx": kinds["2xx"],
            "transport_failures": kinds["transport"], "5xx_with_exception_text": len(leaks),
            "by_case": {name: s for name, s, _ in outcomes}}


# -- bundles ---------------------------------------------------------------------------------------


def build_bundles(work: Path, *, with_tvm: bool) -> dict[str, Path]:
    """The image bundle (conv, [1, 3, 8, 8]) and its signed offload halves; a 2-variant synthetic bundle for
    the soak; with ``with_tvm`` a deployed bundle with compiled libraries (the .so swap)."""
    from hmt.artifacts import load_artifact
    from hmt.artifacts.signing import generate_key_pair, load_private_key, sign_artifact_dir
    from hmt.deploy.offload import write_offload_bundles

    sys.path.insert(0, str(REPO / "tests" / "serve"))
    sys.path.insert(0, str(REPO / "tests" / "offload"))
    offload_bundles = _import_file("hostile_offload_bundles", REPO / "tests" / "offload" / "offload_bundles.py")
    serve_bundles = _import_file("hostile_serve_bundles", REPO / "tests" / "serve" / "serve_bundles.py")
    private, public = generate_key_pair(work / "keys" / "sign.pem")
    conv = offload_bundles.make_conv_bundle(work / "conv")
    sign_artifact_dir(conv, load_artifact(conv, kind="bundle").manifest_sha256, load_private_key(private), version=3)
    split = write_offload_bundles(conv, work / "off" / "device", work / "off" / "peer", seed=3, sign_key=private)
    soak = serve_bundles.make_bundle(work / "soak", [serve_bundles.VariantDef("small", 0.80, 1.0, 10.0, work=2),
                                                     serve_bundles.VariantDef("large", 0.90, 3.0, 20.0, work=8)])
    out = {"conv": conv, "device": split.device, "peer": split.peer, "soak": soak, "private": private,
           "public": public}
    if with_tvm:
        integrity = _import_file("hostile_bench_integrity", REPO / "scripts" / "bench_integrity.py")
        out["tvm"] = integrity._build_bundle(work / "tvm-build")
    return out




def _written(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


