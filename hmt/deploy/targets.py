"""The deploy target registry: what each device runs and how code for it is produced.

Every target is data (a frozen :class:`Target`); ``hmt deploy --list-targets`` prints the
registry, and the tests are parametrised over it, so a new target is listed and tested
without new code.

GPU code, honestly: the PyPI TVM wheel (apache-tvm 0.27, Relax) is built with CUDA but
emits CUDA C, which needs nvcc (or NVRTC) for the device's architecture, and CUDA 13's
nvcc no longer builds sm_53 (Maxwell) or sm_72 (Volta). So no bundle contains GPU code:
Jetson bundles ship the ONNX graphs, from which the device's own TensorRT (JetPack) or
ONNX Runtime's TensorRT/CUDA execution providers build GPU engines on the device. CPU
code (TVM shared libraries) goes only into bundles for targets with a TVM runtime the
device can install (``tvm_runtime``); for the Arm targets none exists, and deploy leaves
TVM out (``no_tvm_reason``), so a bundle never holds a library its device cannot load.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hmt.errors import DeviceError, UsageError

# ELF e_machine values of the CPU architectures below (System V ABI, "e_machine").
ARCH_ELF_MACHINE = {"x86_64": "x86_64", "aarch64": "aarch64"}

# Runtimes every target needs for ``hmt serve`` (the on-device half imports no torch).
_BASE_RUNTIMES = ("python>=3.8 for the device half (hmt serve; the offline stages need 3.10)",
                  "numpy>=1.24", "psutil>=5.9", "onnxruntime>=1.18")
# JetPack 5 ships Python 3.8 (the device half's floor); JetPack 4 ships 3.6, below it.
_PYTHON_FLOOR_NOTE = (
    "the device half runs on Python 3.8 (JetPack 5's: numpy 1.24, onnxruntime 1.19; `hmt serve BUNDLE` runs "
    "there, the offline stages need Python 3.10); on JetPack 4 (Python 3.6) "
    "install Python 3.8 or newer beside the system one (e.g. Miniforge for aarch64, or deadsnakes' "
    "python3.8 on Ubuntu 18.04) and serve from that"
)
# Boards without JetPack (a Raspberry Pi OS, a generic aarch64 Linux): the same floor, no JetPack advice.
_PYTHON_FLOOR_NOTE_PLAIN = (
    "the device half runs on Python 3.8 or newer (numpy 1.24 and onnxruntime 1.18 at the least; `hmt serve "
    "BUNDLE` runs there, the offline stages need Python 3.10)"
)
_TVM_RUNTIME_HOST = "apache-tvm 0.27 runtime (pip apache-tvm==0.27.0.post1; the .so files need this TVM version)"
# Why Arm bundles carry no TVM libraries: a Relax module library (.so) is loaded by the
# "relax.VMExecutable" loader of libtvm_runtime, and no package gives that runtime for
# aarch64. apache-tvm 0.27 has no aarch64 wheel; apache-tvm-ffi has one, but it holds only
# the FFI layer: loading a cross-compiled library with it alone fails ("a loader of that
# name is not registered"), on x86 and in the emulated arm64 device alike.
_NO_TVM_RUNTIME_AARCH64 = (
    "no TVM runtime for aarch64 exists as a package (apache-tvm has no aarch64 wheel; apache-tvm-ffi, "
    "which has one, cannot load a Relax module library without libtvm_runtime): deploy leaves TVM out "
    "for this target and the bundle runs on ONNX Runtime"
)
_GPU_NOTE = (
    "no GPU code in the bundle: the PyPI TVM wheel emits CUDA C and CUDA 13's nvcc cannot build {arch}; "
    "the bundle's ONNX graphs are for on-device GPU engines (TensorRT from JetPack, e.g. `trtexec --onnx=...`, "
    "or ONNX Runtime's TensorRT/CUDA execution providers from NVIDIA's Jetson wheels)"
)


@dataclass(frozen=True)
class GpuSpec:
    """The device's GPU, and how (whether) code for it is produced."""

    name: str
    cuda_arch: str
    memory: str
    code: str  # what the bundle carries for this GPU
    runtimes: tuple[str, ...]


@dataclass(frozen=True)
class Target:
    """One deploy target: CPU, TVM target, cross-compiler, GPU, runtimes, default profile."""

    name: str
    description: str
    arch: str  # CPU architecture as ``uname -m`` says it
    tvm_target: dict[str, Any]
    cross_compiler: str | None  # None: the host's compiler (the target is this machine's arch)
    cross_compiler_package: str | None  # the Debian package that provides it
    runtimes: tuple[str, ...]
    default_profile: str | None  # file name in profiles/, or None (then --profile is needed)
    memory_bytes: int | None = None
    gpu: GpuSpec | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The package that loads this target's TVM libraries on the device; None when none exists
    # for its CPU, and then deploy leaves TVM out (``no_tvm_reason`` says why).
    tvm_runtime: str | None = None
    no_tvm_reason: str | None = None
    # ONNX Runtime execution providers serve tries on the device, in order (hmt.runtime.ort
    # names); the CPU provider always ends the list, and a provider the device's ORT lacks
    # falls back to it with a note in /v1/status.
    providers: tuple[str, ...] = ("cpu",)

    @property
    def elf_machine(self) -> str:
        return ARCH_ELF_MACHINE[self.arch]

    @property
    def runs_tvm(self) -> bool:
        """True when the device can install a runtime that loads this target's TVM libraries."""
        return self.tvm_runtime is not None

    def matches_host(self) -> bool:
        """True when code built for this target can be loaded on this machine."""
        return host_arch() == self.arch

    def compiler(self) -> str:
        """The C compiler that links TVM's objects into a shared library for this target."""
        name = self.cross_compiler or os.environ.get("CXX", "g++")
        if shutil.which(name) is None:
            hint = (f"; install it with `apt-get install -y {self.cross_compiler_package}`"
                    if self.cross_compiler_package else "")
            raise DeviceError(f"target {self.name}: compiler {name!r} not found on PATH{hint} "
                              "(or bundle ONNX only with --engine onnxruntime)")
        return name

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["elf_machine"] = self.elf_machine
        return data


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _aarch64(mcpu: str, cores: int | None, mattr: tuple[str, ...] = ("+neon",)) -> dict[str, Any]:
    target: dict[str, Any] = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": mcpu, "mattr": list(mattr)}
    if cores:
        target["num-cores"] = cores
    return target


_AARCH64_CC = "aarch64-linux-gnu-gcc"
_AARCH64_PKG = "gcc-aarch64-linux-gnu"

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="x86-64",
            description="x86-64 Linux, like this build host (AVX2-class CPU, x86-64-v3)",
            arch="x86_64",
            tvm_target={"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v3"},
            cross_compiler=None,
            cross_compiler_package=None,
            runtimes=(*_BASE_RUNTIMES, _TVM_RUNTIME_HOST),
            tvm_runtime=_TVM_RUNTIME_HOST,
            default_profile="host-amd-epyc-2c.json",
            # x86-64-v3 (AVX2, FMA; 2013+ CPUs) rather than this host's own CPU (znver4) so
            # that the bundle also runs on other x86-64 machines of the last decade.
            notes=("TVM code is built for mcpu x86-64-v3 (AVX2/FMA): it does not run on pre-2013 x86 CPUs",
                   _PYTHON_FLOOR_NOTE_PLAIN),
            # An x86 box may have an NVIDIA GPU: ORT's CUDA provider is used where onnxruntime-gpu
            # is installed, per variant only where fuse measured it faster than the CPU.
            providers=("cuda", "cpu"),
        ),
        Target(
            name="jetson-nano",
            description="NVIDIA Jetson Nano 4GB: 4x Cortex-A57 + 128-core Maxwell GPU (sm_53), 4 GB shared",
            arch="aarch64",
            tvm_target=_aarch64("cortex-a57", 4),
            cross_compiler=_AARCH64_CC,
            cross_compiler_package=_AARCH64_PKG,
            runtimes=_BASE_RUNTIMES,
            no_tvm_reason=_NO_TVM_RUNTIME_AARCH64,
            default_profile="jetson-nano.json",
            memory_bytes=4 * 1024**3,
            gpu=GpuSpec(
                name="128-core Maxwell", cuda_arch="sm_53", memory="shared with the CPU (4 GB in all)",
                code=_GPU_NOTE.format(arch="sm_53"),
                runtimes=("JetPack 4.6 (L4T R32, CUDA 10.2, TensorRT 8.2)",),
            ),
            providers=("tensorrt", "cuda", "cpu"),
            notes=(_PYTHON_FLOOR_NOTE,),
        ),
        Target(
            name="jetson-xavier-nx",
            description="NVIDIA Jetson Xavier NX: 6x Carmel (ARMv8.2) + 384-core Volta GPU (sm_72), 8 GB shared",
            arch="aarch64",
            tvm_target=_aarch64("carmel", 6, ("+neon", "+fullfp16")),
            cross_compiler=_AARCH64_CC,
            cross_compiler_package=_AARCH64_PKG,
            runtimes=_BASE_RUNTIMES,
            no_tvm_reason=_NO_TVM_RUNTIME_AARCH64,
            default_profile="jetson-xavier-nx.json",
            memory_bytes=8 * 1024**3,
            gpu=GpuSpec(
                name="384-core Volta", cuda_arch="sm_72", memory="shared with the CPU (8 GB in all)",
                code=_GPU_NOTE.format(arch="sm_72"),
                runtimes=("JetPack 5.1 (L4T R35, CUDA 11.4, TensorRT 8.5)",),
            ),
            providers=("tensorrt", "cuda", "cpu"),
            notes=(_PYTHON_FLOOR_NOTE,),
        ),
        Target(
            name="raspberry-pi-4b",
            description="Raspberry Pi 4 Model B: 4x Cortex-A72 at 1.5 GHz (64-bit OS), no usable GPU",
            arch="aarch64",
            tvm_target=_aarch64("cortex-a72", 4),
            cross_compiler=_AARCH64_CC,
            cross_compiler_package=_AARCH64_PKG,
            runtimes=_BASE_RUNTIMES,
            no_tvm_reason=_NO_TVM_RUNTIME_AARCH64,
            default_profile="raspberry-pi-4b.json",
            notes=("needs the 64-bit Raspberry Pi OS (aarch64: onnxruntime has no 32-bit Arm wheel); its Python "
                   "(3.11 on Bookworm) runs the device half",
                   _PYTHON_FLOOR_NOTE_PLAIN),
        ),
        Target(
            name="aarch64",
            description="any 64-bit Arm Linux board (generic ARMv8-A code)",
            arch="aarch64",
            tvm_target=_aarch64("generic", None),
            cross_compiler=_AARCH64_CC,
            cross_compiler_package=_AARCH64_PKG,
            runtimes=_BASE_RUNTIMES,
            no_tvm_reason=_NO_TVM_RUNTIME_AARCH64,
            default_profile=None,
            notes=("no profile is shipped for a generic board: pass --profile (measure it with "
                   "`hmt profile-device --rpc ...`)", _PYTHON_FLOOR_NOTE_PLAIN),
        ),
    )
}


def get_target(name: str) -> Target:
    """The registered target ``name``; an unknown name lists the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}; known targets: {', '.join(TARGETS)}") from None


def list_targets() -> list[Target]:
    return list(TARGETS.values())


def default_profile_path(target: Target) -> Path:
    """The shipped profile of ``target`` (``$HMT_PROFILES_DIR`` or the repo's ``profiles/``)."""
    from hmt.profile.devices import profiles_dir

    if target.default_profile is None:
        raise UsageError(f"target {target.name} has no default profile; pass --profile FILE "
                         "(a profile JSON file or a profile-device artifact directory)")
    return profiles_dir() / target.default_profile
