"""The Arm bundles run on an (emulated) arm64 device: hmt installed there from aarch64 wheels
(no torch, no compiler), ``hmt serve BUNDLE`` answering health, status and predict, its
answers and every exit's logits equal to the host's ONNX Runtime within 1e-4.

The device is ``scripts/make_arm64_device.sh``'s: a Debian bookworm arm64 root filesystem
run through qemu-user. The test refreshes hmt's install in it (seconds to a minute) and
skips, saying why, where it cannot be had: not root, no qemu/binfmt, or no device built
(set HMT_ARM64_BUILD=1 to let the test build it: ~10-20 min of debootstrap, then cached).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hmt.bundle import load_bundle
from hmt.client import HmtClient
from hmt.deploy import DeployOptions, deploy_bundle, get_target

sys.path.insert(0, str(Path(__file__).parent))

from arm64_chain import chain_logits

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "make_arm64_device.sh"
ATOL = 1e-4
# python + numpy + ONNX Runtime imported under instruction emulation, on a shared CPU (~2 min here)
SERVE_START_S = 600.0
URL = re.compile(r"http://127\.0\.0\.1:(\d+)")


def device_root() -> Path:
    return Path(os.environ.get("HMT_ARM64_ROOT") or Path.home() / ".cache" / "hmt" / "arm64-root")


@pytest.fixture(scope="module")
def arm64_device() -> Path:
    """The device's root, with this checkout's hmt installed in it."""
    build = os.environ.get("HMT_ARM64_BUILD") == "1"
    if os.geteuid() != 0:
        pytest.skip("the emulated arm64 device needs root (debootstrap, chroot, binfmt_misc)")
    root = device_root()
    if not (root / ".hmt-rootfs-ready").is_file() and not build:
        pytest.skip(f"no emulated arm64 device at {root}: build it with scripts/make_arm64_device.sh "
                    "(apt-get installs qemu-user-static binfmt-support debootstrap), or set HMT_ARM64_BUILD=1")
    if shutil.which("qemu-aarch64-static") is None and not build:
        pytest.skip("qemu-aarch64-static not found: apt-get install -y qemu-user-static binfmt-support")
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "HMT_ARM64_ROOT": str(root)})
    if done.returncode != 0:
        message = f"scripts/make_arm64_device.sh failed: {done.stderr.strip().splitlines()[-1:]}"
        if build:
            pytest.fail(message)
        pytest.skip(message)
    return root


def device_env(cpu: str | None = None) -> dict[str, str]:
    """The script's environment; ``cpu``: the qemu CPU model the device emulates (the target's core)."""
    env = {**os.environ, "HMT_ARM64_ROOT": str(device_root())}
    if cpu is not None:
        env["HMT_ARM64_CPU"] = cpu
    return env


def in_device(*argv: str, cpu: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "--run", *argv], capture_output=True, text=True, timeout=timeout,
                          env=device_env(cpu))


@pytest.fixture
def device_dir(arm64_device: Path) -> Iterator[tuple[Path, str]]:
    """A scratch folder inside the device: (host path, path as the device sees it)."""
    inside = f"/tmp/hmt-test-{uuid.uuid4().hex[:12]}"
    host = arm64_device / inside.lstrip("/")
    host.mkdir(parents=True)
    try:
        yield host, inside
    finally:
        shutil.rmtree(host, ignore_errors=True)


def test_device_is_arm64_with_no_torch_and_no_compiler(arm64_device: Path) -> None:
    probe = in_device("python", "-c", "import platform, importlib.util as u; print(platform.machine(), "
                      "*(u.find_spec(m) is None for m in ('torch', 'onnx', 'tvm')))")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["aarch64", "True", "True", "True"]
    compilers = in_device("sh", "-c", "command -v gcc cc g++ c++ clang || echo none")
    assert compilers.stdout.strip() == "none"


def _start_serve(bundle_inside: str, cpu: str) -> tuple[subprocess.Popen[str], int]:
    """``hmt serve`` in the device; (process, port) once it names its URL. stderr is read by a
    thread, so a server that never names one fails the test at the deadline with what it said."""
    proc = subprocess.Popen(["bash", str(SCRIPT), "--run", "hmt", "serve", bundle_inside, "--port", "0", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=device_env(cpu))
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + SERVE_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        match = next((m for m in map(URL.search, list(lines)) if m), None)
        if match:
            return proc, int(match.group(1))
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"serve named no URL (exit {proc.poll()}): {''.join(lines)[-3000:]}")


@pytest.mark.parametrize("target", ["raspberry-pi-4b", "jetson-nano"])
def test_arm_bundle_serves_in_the_emulated_device_like_the_host(
        arm64_device: Path, device_dir: tuple[Path, str], fused_dir: Path, pareto_dir: Path, target: str) -> None:
    host_dir, inside = device_dir
    bundle_dir = host_dir / "bundle"
    deploy_bundle(fused_dir, pareto_dir, bundle_dir, options=DeployOptions(target=target, archive=False))
    bundle = load_bundle(bundle_dir)
    cpu = str(get_target(target).tvm_target["mcpu"])  # cortex-a72 (Raspberry Pi 4), cortex-a57 (Jetson Nano)
    inputs = np.random.default_rng(23).standard_normal((8, *bundle.spec.input.shape[1:])).astype(np.float32)
    np.save(host_dir / "inputs.npy", inputs)
    shutil.copy(Path(__file__).parent / "arm64_chain.py", host_dir / "arm64_chain.py")

    # Every exit of every variant, through the runtime layer serve uses: device vs host.
    ran = in_device("python", f"{inside}/arm64_chain.py", f"{inside}/bundle", f"{inside}/inputs.npy",
                    f"{inside}/logits.npz", cpu=cpu)
    assert ran.returncode == 0, ran.stderr[-2000:]
    host = chain_logits(bundle_dir, inputs)
    with np.load(host_dir / "logits.npz") as device:
        assert sorted(device.files) == sorted(host)
        for key, expected in host.items():
            np.testing.assert_allclose(device[key], expected, atol=ATOL, rtol=0, err_msg=key)

    # hmt serve inside the device, asked over real HTTP from the host.
    t0 = time.monotonic()
    proc, port = _start_serve(f"{inside}/bundle", cpu)
    try:
        with HmtClient(f"http://127.0.0.1:{port}", timeout_s=120) as client:
            while not client.health()["ready"]:
                assert time.monotonic() - t0 < SERVE_START_S, "serve never became ready in the device"
                time.sleep(0.5)
            status = client.status()
            assert status["variant"] in {v.arch_id for v in bundle.spec.variants}
            for row, x in enumerate(inputs):
                answer = client.predict(x[None])
                logits = host[f"{answer['variant']}/exit{answer['exit']}"][row].astype(np.float64)
                weights = np.exp(logits - logits.max())
                assert answer["class"] == int(np.argmax(logits))
                assert abs(answer["confidence"] - float(weights.max() / weights.sum())) <= ATOL
            assert client.status()["requests"] >= len(inputs)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
