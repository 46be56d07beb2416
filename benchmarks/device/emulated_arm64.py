"""The Arm bundles on the emulated arm64 device (scripts/make_arm64_device.sh): what a device
install holds, how long ``hmt serve`` takes to become ready there, and whether its outputs
equal the host's ONNX Runtime.

    python -m benchmarks.device.emulated_arm64 [--quick] [--out PATH]

Per target (raspberry-pi-4b, jetson-nano): deploy a bundle of the tiny segmented test
model, run every exit of every variant through hmt's runtime layer inside the device and on
the host (max |device - host|), start ``hmt serve`` in the device and time it until
/v1/health/ready answers 200 (the baseline: the same serve started natively on the host, in
the same run), and compare its answers (class, softmax confidence) with the host's logits.
Timing under instruction emulation says nothing about a board's speed: the start time is
what a user of the emulated device waits, nothing more. Needs root and a built device;
``--quick`` (one target, the logits only: no install refresh, no serve start) writes to a
temporary folder.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "make_arm64_device.sh"
RESULTS = Path(__file__).parent / "results"
TARGETS = ("raspberry-pi-4b", "jetson-nano")
SEED = 23
INPUTS = 16
READY_TIMEOUT_S = 600.0


def device_root() -> Path:
    return Path(os.environ.get("HMT_ARM64_ROOT") or Path.home() / ".cache" / "hmt" / "arm64-root")


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
            "note": "shared machine (other developers' jobs running): timings are indicative"}


def _load_test_module(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_inputs(root: Path) -> tuple[Path, Path]:
    """fuse's tiny segmented test model, converted and fused, and a front naming it (as deploy's tests do)."""
    from hmt.convert import TorchSource, convert_model
    from hmt.fuse import FuseOptions, fuse_model

    tests = REPO / "tests"
    source = _load_test_module("_fuse_conftest", tests / "fuse" / "conftest.py").SEGMENTED
    deploy_conftest = _load_test_module("_deploy_conftest", tests / "deploy" / "conftest.py")
    (root / "seg.py").write_text(source)
    convert_model(TorchSource(f"{root / 'seg.py'}:segmented", ((1, 3, 16, 16),)), root / "converted")
    fuse_model(root / "converted", root / "fused", options=FuseOptions(engines=("ort",), repeats=2, warmup=1))
    report = json.loads((root / "fused" / "report.json").read_text())
    arch_id = str(report["variants"][0].get("arch_id") or report["variants"][0]["name"])
    pareto = deploy_conftest.make_pareto(root / "pareto", [deploy_conftest.point(arch_id)])
    return root / "fused", Path(pareto)


def run_script(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HMT_ARM64_ROOT": str(device_root())})


def wait_ready(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int, float]:
    """Start a server; (process, port, seconds from start to /v1/health/ready answering 200)."""
    from hmt.client import HmtClient

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    match = None
    for _ in range(200):
        line = proc.stderr.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if match or not line:
            break
    if match is None:
        proc.kill()
        raise RuntimeError(f"serve did not start: {proc.communicate()[1][-2000:]}")
    port = int(match.group(1))
    with HmtClient(f"http://127.0.0.1:{port}", timeout_s=120) as client:
        while not client.health()["ready"]:
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                proc.kill()
                raise RuntimeError("serve never became ready")
            time.sleep(0.1)
    return proc, port, time.monotonic() - t0


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def served_confidence_error(port: int, inputs: np.ndarray, host: dict[str, np.ndarray]) -> tuple[float, int]:
    """(max |served confidence - host softmax|, class disagreements) over ``inputs``."""
    from hmt.client import HmtClient

    worst, wrong = 0.0, 0
    with HmtClient(f"http://127.0.0.1:{port}", timeout_s=120) as client:
        for row, x in enumerate(inputs):
            answer = client.predict(x[None])
            logits = host[f"{answer['variant']}/exit{answer['exit']}"][row].astype(np.float64)
            weights = np.exp(logits - logits.max())
            worst = max(worst, abs(answer["confidence"] - float(weights.max() / weights.sum())))
            wrong += int(answer["class"] != int(np.argmax(logits)))
    return worst, wrong


def bench_target(target: str, fused: Path, pareto: Path, reps: int) -> dict[str, Any]:
    """One target's bundle in the device: logits vs the host's, and ``reps`` serve starts (0: none)."""
    from hmt.bundle import load_bundle
    from hmt.deploy import DeployOptions, deploy_bundle

    sys.path.insert(0, str(REPO / "tests" / "deploy"))
    from arm64_chain import chain_logits

    inside = f"/tmp/hmt-bench-{uuid.uuid4().hex[:12]}"
    host_dir = device_root() / inside.lstrip("/")
    host_dir.mkdir(parents=True)
    try:
        result = deploy_bundle(fused, pareto, host_dir / "bundle", options=DeployOptions(target=target, archive=False))
        bundle = load_bundle(host_dir / "bundle")
        rng = np.random.default_rng(SEED)
        inputs = rng.standard_normal((INPUTS, *bundle.spec.input.shape[1:])).astype(np.float32)
        np.save(host_dir / "inputs.npy", inputs)
        shutil.copy(REPO / "tests" / "deploy" / "arm64_chain.py", host_dir / "arm64_chain.py")
        ran = run_script("--run", "python", f"{inside}/arm64_chain.py", f"{inside}/bundle", f"{inside}/inputs.npy",
                         f"{inside}/logits.npz")
        if ran.returncode != 0:
            raise RuntimeError(f"the chain failed in the device: {ran.stderr[-2000:]}")
        host = chain_logits(host_dir / "bundle", inputs)
        with np.load(host_dir / "logits.npz") as device:
            logits_error = max(float(np.max(np.abs(device[k] - v))) for k, v in host.items())
        device_start, host_start = [], []
        served_error, served_wrong = 0.0, 0
        for _ in range(reps):
            proc, port, start_s = wait_ready(
                ["bash", str(SCRIPT), "--run", "hmt", "serve", f"{inside}/bundle", "--port", "0", "--json"],
                {**os.environ, "HMT_ARM64_ROOT": str(device_root())})
            try:
                device_start.append(start_s)
                error, wrong = served_confidence_error(port, inputs, host)
                served_error, served_wrong = max(served_error, error), served_wrong + wrong
            finally:
                stop(proc)
            proc, port, start_s = wait_ready(
                [sys.executable, "-m", "commands.app", "serve", str(host_dir / "bundle"), "--port", "0", "--json"],
                {**os.environ, "PYTHONPATH": str(REPO)})
            host_start.append(start_s)
            stop(proc)
        if not reps:
            return {"target": target, "exits_compared": len(host), "inputs": INPUTS,
                    "max_abs_logit_error_device_vs_host": logits_error, "repetitions": 0}
        return {
            "target": target, "engines": sorted({e for v in result.variants for e in v.engines}),
            "bundle_size_bytes": result.size_bytes, "variants": len(result.variants),
            "exits_compared": len(host), "inputs": INPUTS,
            "max_abs_logit_error_device_vs_host": logits_error,
            "max_abs_served_confidence_error": served_error, "served_class_disagreements": served_wrong,
            "serve_ready_s_device_median": statistics.median(device_start), "serve_ready_s_device": device_start,
            "serve_ready_s_host_median": statistics.median(host_start), "serve_ready_s_host": host_start,
            "repetitions": reps,
        }
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def installed(root: Path) -> dict[str, Any]:
    listed = run_script("--wheels")
    if listed.returncode != 0:
        raise RuntimeError(f"cannot list the device's packages: {listed.stderr[-500:]}")
    packages = sorted(line for line in listed.stdout.splitlines() if "==" in line)
    names = {p.split("==")[0].lower().replace("-", "_") for p in packages}
    wheels = {}
    for line in listed.stdout.splitlines():
        size, _, name = line.partition(" ")
        if name.endswith(".whl") and name.split("-")[0].lower() in names:
            wheels[name] = int(size)
    return {"packages": packages, "wheel_size_bytes": wheels, "wheels_total_bytes": sum(wheels.values()),
            "torch_installed": "torch" in names, "onnx_installed": "onnx" in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one target, one repetition, into a temp folder")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp()) / "emulated_arm64.json" if args.quick
                       else RESULTS / "emulated_arm64.json")
    doc: dict[str, Any] = {
        "area": "device", "name": "emulated_arm64",
        "command": "python -m benchmarks.device.emulated_arm64" + (" --quick" if args.quick else ""),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "revision": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                   cwd=REPO).stdout.strip(),
        "machine": machine(), "seed": SEED,
    }
    root = device_root()
    if os.geteuid() != 0 or not (root / ".hmt-rootfs-ready").is_file():
        doc["skipped"] = "no emulated arm64 device (needs root and scripts/make_arm64_device.sh)"
        print(json.dumps(doc, indent=2))
        return 0 if args.quick else 1
    t0 = time.monotonic()
    if not args.quick:
        refreshed = run_script()
        if refreshed.returncode != 0:
            raise SystemExit(f"scripts/make_arm64_device.sh failed: {refreshed.stderr[-1000:]}")
    install_s = time.monotonic() - t0
    device = installed(root)
    device["uname_m"] = run_script("--run", "uname", "-m").stdout.strip()
    device["python"] = run_script("--run", "python", "--version").stdout.strip()
    device["refresh_install_s"] = None if args.quick else round(install_s, 1)
    with tempfile.TemporaryDirectory(prefix="hmt-bench-device-") as tmp:
        fused, pareto = build_inputs(Path(tmp))
        targets = TARGETS[:1] if args.quick else TARGETS
        per_target = [bench_target(t, fused, pareto, 0 if args.quick else 3) for t in targets]
    doc["baseline"] = ("the same bundle served natively on the host (x86-64, ONNX Runtime): start-to-ready time; "
                       "the host's ONNX Runtime logits for the same seeded inputs")
    doc["results"] = {"device": device, "targets": per_target}
    worst = max(t["max_abs_logit_error_device_vs_host"] for t in per_target)
    doc["claims"] = [
        {"claim": "the device install holds no torch and no onnx", "figure":
            f"torch {device['torch_installed']}, onnx {device['onnx_installed']}; "
            f"{len(device['packages'])} packages, wheels {device['wheels_total_bytes'] / 1e6:.1f} MB"},
        {"claim": "every exit's logits in the emulated arm64 device equal the host's ONNX Runtime",
         "figure": f"max |device - host| {worst:.2e} (bound 1e-4)"},
        *({"claim": f"hmt serve of the {t['target']} bundle becomes ready in the emulated device",
           "figure": f"median {t['serve_ready_s_device_median']:.1f} s under emulation vs "
                     f"{t['serve_ready_s_host_median']:.1f} s natively ({t['repetitions']} repetitions)"}
          for t in per_target if t["repetitions"]),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["claims"], indent=2))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
