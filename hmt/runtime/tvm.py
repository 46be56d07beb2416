"""TVM Relax modules exported as shared libraries, loaded and run without torch.

The VM is not documented as safe to call from several threads at once, so the serve
path (:func:`tvm_graph_fn`) gives each calling thread its own VM over the shared loaded
module. ``threads`` sets TVM_NUM_THREADS before the runtime starts its pool (the first
TVM load of the process wins): TVM's pool workers spin while idle, which reads as a busy
CPU, so small graphs are better served by one thread per request.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hmt.errors import DeviceError, ModelError

GraphFn = Callable[[np.ndarray], np.ndarray]


def tvm_available() -> bool:
    return importlib.util.find_spec("tvm") is not None


@contextlib.contextmanager
def torch_hidden() -> Iterator[None]:
    """tvm_ffi imports torch when it is installed (for DLPack interop hmt does not use);
    an entry of None makes that import fail fast, which tvm_ffi tolerates."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


def import_tvm() -> tuple[Any, Any]:
    """``(tvm, tvm.relax)``, imported with torch hidden; DeviceError when TVM is missing or broken."""
    try:
        with torch_hidden():
            import tvm
            from tvm import relax
    except Exception as exc:
        raise DeviceError(f"the TVM runtime cannot be imported ({exc})") from exc
    return tvm, relax


def tvm_device(device: str = "cpu") -> Any:
    tvm, _ = import_tvm()
    return tvm.cuda(0) if device == "cuda" else tvm.cpu(0)


# TVM 0.27 never frees a loaded library module: each ``load_module`` of the same .so kept
# ~0.75x the file's size for good (138 KB per load of a 182 KB library; 183 KB per variant
# load over 1,000 load/evict cycles of the demo bundle, benchmarks/serve/pool_churn.py). A
# module verified once is therefore loaded once per process and content (its sha256: the
# serve path loads private copies, hmt.runtime.verified.private_copy, each at a new path)
# and reused; what an eviction frees is the VMs. Memory stays bounded by the bundle.
_MODULES: dict[str, Any] = {}
_MODULES_LOCK = threading.Lock()


def load_tvm_module(path: Path, device: str = "cpu", *, sha256: str | None = None) -> tuple[Any, Any]:
    """``(module, dev)``: the library at ``path`` loaded and one VM built on it (fails here, not later).

    With ``sha256`` (the digest of the very bytes at ``path``, just verified) the module is
    cached for the process under it: a library changed on disk has another digest and is never
    served from it.
    """
    tvm, relax = import_tvm()
    dev = tvm_device(device)
    key = sha256
    try:
        with _MODULES_LOCK:
            module = _MODULES.get(key) if key is not None else None
            if module is None:
                module = tvm.runtime.load_module(str(path))
                if key is not None:
                    _MODULES[key] = module
        relax.VirtualMachine(module, dev)
    except Exception as exc:
        raise ModelError(f"{path}: TVM cannot load the module ({exc})") from exc
    return module, dev


def flatten_outputs(value: Any) -> list[Any]:
    """A VM result (a tensor, or nested tuples of them) as a flat list of numpy arrays."""
    tvm, _ = import_tvm()
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or (hasattr(value, "__len__") and not hasattr(value, "numpy")):
        items: list[Any] = []
        for item in value:
            items.extend(flatten_outputs(item))
        return items
    return [value.numpy()]


def tvm_graph_fn(path: Path, threads: int = 1, *, sha256: str | None = None) -> GraphFn:
    """One library on the CPU as ``x -> first output`` (one VM per calling thread)."""
    if threads > 0:
        os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    tvm, relax = import_tvm()
    module, dev = load_tvm_module(path, sha256=sha256)
    local = threading.local()

    def run(x: np.ndarray) -> np.ndarray:
        main = getattr(local, "main", None)
        if main is None:
            main = local.main = relax.VirtualMachine(module, dev)["main"]
        out = main(tvm.runtime.tensor(x, dev))
        while not hasattr(out, "numpy"):  # a tuple of outputs: the first is the answer
            out = out[0]
        result: np.ndarray = out.numpy()
        return result

    return run


def tvm_feeds_fn(path: Path, input_name: str, device: str = "cpu") -> Callable[[dict[str, Any]], list[Any]]:
    """One library as ``feeds -> every output`` (fuse's timing: numpy or device tensors in, synced on CUDA)."""
    tvm, relax = import_tvm()
    module, dev = load_tvm_module(path, device)
    main = relax.VirtualMachine(module, dev)["main"]

    def step(feeds: dict[str, Any]) -> list[Any]:
        value = feeds[input_name]
        out = main(value if isinstance(value, tvm.runtime.Tensor) else tvm.runtime.tensor(value, dev))
        if device == "cuda":
            dev.sync()
        return flatten_outputs(out)

    return step
