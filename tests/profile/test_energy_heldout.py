"""eq. 1 judged on held-out variants (the energy benchmark's arithmetic), and NVML without pynvml."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.device import energy_heldout
from hmt.errors import DeviceError, InputError
from hmt.profile.calibrate import Workload, held_out_energy
from hmt.profile.power import nvml
from hmt.profile.power.fake import FakePowerSource

REPO = Path(__file__).resolve().parents[2]
NAMES = ("d1_per_mac", "d2_per_cache_access", "d3_per_dram_access")
TRUE_MJ = (2e-9, 1.2e-8, 4e-7)


def _rows(n: int, seed: int = 0) -> np.ndarray:
    """Feature rows spread like supernet variants': MACs 1e8..1e10, accesses 1e6..1e8, misses varied."""
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(1e8, 1e10, n), rng.uniform(1e6, 1e8, n), rng.uniform(0, 2e6, n)])


def _workloads(rows: np.ndarray) -> list[Workload]:
    return [Workload(f"v{i}", lambda: time.sleep(0.002), tuple(float(v) for v in row)) for i, row in enumerate(rows)]


def test_held_out_energy_recovers_a_meter_that_follows_eq1() -> None:
    rows = _rows(12)
    source = FakePowerSource(coefficients_mj=TRUE_MJ, noise_w=0.05, seed=1)
    energies, latencies, idles = energy_heldout.measure(source, _workloads(rows), repetitions=2, window_s=0.08,
                                                        idle_s=0.05)
    assert energies.shape == latencies.shape == (2, 12) and len(idles) == 2
    truth = rows @ np.asarray(TRUE_MJ)
    measured = np.median(energies, axis=0)
    assert np.allclose(measured, truth, rtol=0.1)
    report = energy_heldout.evaluate(rows, measured, names=NAMES, labels=[f"v{i}" for i in range(12)],
                                     families=["structured" if i % 3 == 0 else "per-block" for i in range(12)],
                                     layers=[20 + i for i in range(12)])
    assert report["eq1_leave_one_variant_out"]["share_within_15pct"] == 1.0
    assert report["eq1_leave_one_variant_out"]["mape"] < 0.05
    assert report["fixed_split"]["eq1"]["n"] == 4
    assert report["mac_baseline_leave_one_variant_out"]["mape"] > report["eq1_leave_one_variant_out"]["mape"]
    assert len(report["per_variant"]) == 12 and "diagnostic_eq1_plus_per_layer_leave_one_variant_out" in report


def test_held_out_error_exposes_a_meter_eq1_cannot_explain() -> None:
    rows = _rows(10, seed=3)
    # Energy with a large fixed cost per inference that eq. 1 has no term for: in-sample the
    # fit bends to it, held out it misses the small variants.
    energy = rows @ np.asarray(TRUE_MJ) + 5.0 * (np.arange(10) % 2)
    predicted = held_out_energy(rows, energy, names=NAMES, groups=[f"v{i}" for i in range(10)])
    assert float(np.mean(np.abs(predicted - energy) / energy)) > 0.15


def test_held_out_energy_never_predicts_a_row_from_its_own_group() -> None:
    rows = _rows(6)
    energy = rows @ np.asarray(TRUE_MJ)
    energy[:2] *= 3.0  # one variant measured twice, both far off the others
    predicted = held_out_energy(rows, energy, names=NAMES, groups=["a", "a", "b", "c", "d", "e"])
    assert np.all(np.abs(predicted[:2] - energy[:2]) / energy[:2] > 0.5)
    with pytest.raises(InputError, match="at least 2 groups"):
        held_out_energy(rows, energy, names=NAMES, groups=["a"] * 6)


def test_the_benchmark_on_a_machine_without_a_gpu_says_so(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the gpu-marked test runs the benchmark")
    out = tmp_path / "energy.json"
    quick = subprocess.run([sys.executable, "-m", "benchmarks.device.energy_heldout", "--quick", "--out", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=120,
                           env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert quick.returncode == 0 and "no NVIDIA GPU / NVML" in quick.stderr
    doc = json.loads(out.read_text())
    assert doc["results"]["skipped"].startswith("no NVIDIA GPU / NVML") and doc["claims"] == []
    full = subprocess.run([sys.executable, "-m", "benchmarks.device.energy_heldout", "--out", str(tmp_path / "f.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert full.returncode == 7 and "no NVIDIA GPU / NVML" in full.stderr
    assert not (tmp_path / "f.json").exists()


@pytest.mark.gpu
def test_the_benchmark_quick_run_on_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "energy.json"
    assert energy_heldout.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    loo = doc["results"]["eq1_leave_one_variant_out"]
    assert loo["n"] >= 6 and doc["claims"]
    assert all(v["energy_mj_per_batch_median"] > 0 for v in doc["results"]["variants"])


# --------------------------------------------------------------------------- NVML through ctypes


class _FakeLib:
    """libnvidia-ml's C calls as ctypes sees them: out-parameters arrive as byref() objects."""

    def __init__(self, *, energy_supported: bool = True, gpus: int = 1) -> None:
        self.energy_supported = energy_supported
        self.gpus = gpus
        self.opened: list[Any] = []  # the index or UUID of every handle asked for
        self.nvmlErrorString = _Fn(lambda code: b"Not Supported" if code == 3 else b"Unknown Error")

    def __getattr__(self, name: str) -> Any:
        table = {
            "nvmlInit_v2": lambda: 0,
            "nvmlDeviceGetCount_v2": lambda count: self._set(count, self.gpus),
            "nvmlDeviceGetHandleByIndex_v2": lambda index, handle: (self.opened.append(index.value),
                                                                    self._set(handle, 1234))[1],
            "nvmlDeviceGetHandleByUUID": lambda uuid, handle: (self.opened.append(uuid.value),
                                                               self._set(handle, 1235))[1],
            "nvmlDeviceGetTotalEnergyConsumption": lambda handle, out: (
                self._set(out, 5_000_000) if self.energy_supported else 3),
            "nvmlDeviceGetPowerUsage": lambda handle, out: self._set(out, 71_500),
            "nvmlDeviceGetName": lambda handle, buffer, length: (ctypes.memmove(buffer, b"NVIDIA H100\0", 12), 0)[1],
        }
        return table[name]

    @staticmethod
    def _set(ref: Any, value: int) -> int:
        ref._obj.value = value
        return 0


class _Fn:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _ctypes_nvml(monkeypatch: pytest.MonkeyPatch, lib: _FakeLib) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(nvml.ctypes, "CDLL", lambda name: lib)


def test_nvml_without_pynvml_reads_the_counter_through_ctypes(monkeypatch: pytest.MonkeyPatch) -> None:
    _ctypes_nvml(monkeypatch, _FakeLib())
    source = nvml.NvmlSource()
    assert source.cumulative and source.read() == pytest.approx(5000.0)  # 5e6 mJ -> J
    assert "ctypes" in source.describe() and source.gpu_name() == "NVIDIA H100"


def test_nvml_ctypes_falls_back_to_board_power(monkeypatch: pytest.MonkeyPatch) -> None:
    _ctypes_nvml(monkeypatch, _FakeLib(energy_supported=False))
    source = nvml.NvmlSource()
    assert not source.cumulative and source.read() == pytest.approx(71.5)
    with pytest.raises(nvml.NvmlCallError, match="Not Supported"):
        source._nv.nvmlDeviceGetTotalEnergyConsumption(source.handle)


def test_nvml_without_pynvml_or_driver_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)

    def missing(name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(nvml.ctypes, "CDLL", missing)
    monkeypatch.setattr(nvml.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(DeviceError, match="no NVIDIA GPU / NVML.*nvidia-ml-py.*libnvidia-ml.so.1"):
        nvml.NvmlSource()


def test_nvml_meters_the_gpu_cuda_visible_devices_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA device 0 of a process started with CUDA_VISIBLE_DEVICES=3 is the host's GPU 3: NVML,
    which counts every GPU of the host, must read that one, not the host's GPU 0 (another job's)."""
    lib = _FakeLib(gpus=4)
    _ctypes_nvml(monkeypatch, lib)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml.NvmlSource().nvml_gpu == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    source = nvml.NvmlSource()
    assert source.nvml_gpu == 3 and lib.opened[-1] == 3 and "host GPU 3" in source.describe()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-f003b975-272f,1")
    assert nvml.NvmlSource().nvml_gpu == "GPU-f003b975-272f" and lib.opened[-1] == b"GPU-f003b975-272f"
    assert nvml.NvmlSource(index=1).nvml_gpu == 1
    with pytest.raises(DeviceError, match="CUDA_VISIBLE_DEVICES='GPU-f003b975-272f,1' makes 2 visible"):
        nvml.NvmlSource(index=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(DeviceError, match="no GPU 7; this machine has 4"):
        nvml.NvmlSource()
