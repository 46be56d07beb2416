"""ONNX Runtime sessions, built in one place: options, providers with a recorded CPU fallback.

:class:`OrtOptions` is the session configuration fuse measures and writes into its report
(``{"level", "intra_op_threads", "allow_spinning", ...}``) and serve rebuilds from the
bundle, so what serve runs is what fuse timed. :func:`ort_session` builds a session on
an in-memory model (the verified bytes, see :mod:`hmt.runtime.verified`) or a path.

Providers: ``providers`` names what to try in order, e.g. ``("tensorrt", "cuda", "cpu")``
(ORT's own names are accepted too). A provider this ONNX Runtime build lacks is dropped
and the session falls back to the CPU provider, which is always last; every fallback is
recorded in :attr:`OrtSession.notes` so status pages and reports can say what really ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hmt.errors import DeviceError, ModelError, UsageError

LEVELS = ("disable", "basic", "extended", "all")
EXECUTION_MODES = ("sequential", "parallel")
PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
CPU_PROVIDER = PROVIDER_NAMES["cpu"]

GraphFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class OrtOptions:
    """A session configuration fuse can measure and serve can rebuild (0 threads = ORT's default)."""

    level: str = "all"
    intra_op_threads: int = 0
    allow_spinning: bool = True
    # Parallel operators (CrowdHMTware III-C1 (2)): "parallel" runs independent branches of
    # the graph at once on ``inter_op_threads`` (0: ORT's default).
    execution_mode: str = "sequential"
    inter_op_threads: int = 0
    # ORT's static memory plan and CPU arena (both on: ORT's default).
    mem_pattern: bool = True
    cpu_arena: bool = True

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise UsageError(f"ORT optimisation level must be one of {list(LEVELS)}, got {self.level!r}")
        if self.execution_mode not in EXECUTION_MODES:
            raise UsageError(f"ORT execution_mode must be one of {list(EXECUTION_MODES)}, got {self.execution_mode!r}")
        for name in ("intra_op_threads", "inter_op_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"ORT {name} must be an integer >= 0, got {value!r}")

    @property
    def name(self) -> str:
        threads = "default" if self.intra_op_threads == 0 else str(self.intra_op_threads)
        spin = "" if self.allow_spinning else ",nospin"
        extra = ""
        if self.execution_mode != "sequential":
            extra += f",{self.execution_mode}" + (f",inter={self.inter_op_threads}" if self.inter_op_threads else "")
        extra += "" if self.mem_pattern else ",nomempattern"
        extra += "" if self.cpu_arena else ",noarena"
        return f"ort[{self.level},threads={threads}{spin}{extra}]"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"level": self.level, "intra_op_threads": self.intra_op_threads,
                                "allow_spinning": self.allow_spinning}
        # Only what differs from ORT's defaults, so reports and bundles stay readable by
        # readers that predate these fields (and byte-identical to what they wrote).
        if self.execution_mode != "sequential" or self.inter_op_threads:
            data.update({"execution_mode": self.execution_mode, "inter_op_threads": self.inter_op_threads})
        if not self.mem_pattern or not self.cpu_arena:
            data.update({"mem_pattern": self.mem_pattern, "cpu_arena": self.cpu_arena})
        return data

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "ort options") -> OrtOptions:
        if not isinstance(data, Mapping):
            raise UsageError(f"{where}: expected an object of ORT options")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(f"{where}: unknown ORT option(s) {unknown}; expected some of {sorted(names)}")
        try:
            return cls(**dict(data))
        except TypeError as exc:
            raise UsageError(f"{where}: {exc}") from exc


def optimization_level(level: str) -> Any:
    """ONNX Runtime's enum for a level name: disable, basic, extended or all."""
    import onnxruntime as ort

    if level not in LEVELS:
        raise UsageError(f"ORT optimisation level must be one of {list(LEVELS)}, got {level!r}")
    return {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]


def session_options(options: OrtOptions) -> Any:
    """ORT ``SessionOptions`` for ``options`` (logging quiet: errors come back as exceptions)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = optimization_level(options.level)
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if options.execution_mode == "parallel"
                         else ort.ExecutionMode.ORT_SEQUENTIAL)
    so.log_severity_level = 3
    so.enable_mem_pattern = options.mem_pattern
    so.enable_cpu_mem_arena = options.cpu_arena
    if not options.allow_spinning:
        # Spinning workers burn a core between calls; on a small shared device that steals
        # the very CPU the load index measures.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def parse_providers(text: str | None, where: str = "--providers") -> tuple[str, ...] | None:
    """``"cuda,cpu"`` -> ``("cuda", "cpu")`` (None stays None); an unknown name is a UsageError."""
    if text is None:
        return None
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in PROVIDER_NAMES and p not in PROVIDER_NAMES.values()]
    if not names or unknown:
        raise UsageError(f"{where}: expected a comma-separated list of {', '.join(PROVIDER_NAMES)}, got {text!r}")
    return names


# The oldest ONNX Runtime that loads the graphs hmt bundles (they import the ai.onnx.ml opset 5 domain, which
# 1.16 and 1.17 refuse to load: "Current official support for domain ai.onnx.ml is till opset 4");
# pyproject.toml's floor for Python < 3.10 is this one (tests/runtime/test_python_floor.py).
ORT_MIN_VERSION = (1, 18)


def check_version(version: str) -> None:
    """Refuse (DeviceError) an ONNX Runtime older than :data:`ORT_MIN_VERSION`, naming both: such a build
    fails every graph with a long opset message (an older pip picks 1.16 on JetPack 5; NVIDIA's Jetson wheels
    go back to it too)."""
    import re

    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match.group(1)), int(match.group(2))) >= ORT_MIN_VERSION:
        return
    floor = ".".join(map(str, ORT_MIN_VERSION))
    raise DeviceError(f"onnxruntime {version[:40]} is installed; hmt's bundles need onnxruntime >= {floor} "
                      f"(pip install --upgrade 'onnxruntime>={floor}', after pip install --upgrade pip on "
                      "an older pip)")


def available_providers() -> list[str]:
    import onnxruntime as ort

    check_version(str(getattr(ort, "__version__", "")))
    return list(ort.get_available_providers())


def resolve_providers(requested: Sequence[str] = ("cpu",)) -> tuple[list[str], list[str]]:
    """ORT provider names for ``requested`` (short or ORT names), and notes on any fallback.

    Providers this ORT lacks are dropped with a note; the CPU provider always ends the
    list, so a session can always be built.
    """
    available = set(available_providers())
    chosen: list[str] = []
    notes: list[str] = []
    for name in requested:
        full = PROVIDER_NAMES.get(name, name)
        if full not in PROVIDER_NAMES.values():
            raise UsageError(f"unknown ORT provider {name!r}; expected some of {sorted(PROVIDER_NAMES)}")
        if full in available:
            if full not in chosen:
                chosen.append(full)
        else:
            notes.append(f"{full} is not available in this ONNX Runtime build "
                         f"(available: {sorted(available)}); falling back to {CPU_PROVIDER}")
    if CPU_PROVIDER in chosen:
        chosen.remove(CPU_PROVIDER)
    chosen.append(CPU_PROVIDER)
    return chosen, notes


def usable_providers(requested: Sequence[str]) -> list[str]:
    """The short names of ``requested`` this ONNX Runtime build has, in order, the CPU always last
    (what a session built from ``requested`` can bind: status reports this, not the request).
    Without onnxruntime (a TVM-only device) the request as given."""
    try:
        chosen, _ = resolve_providers(requested)
    except ImportError:
        return list(requested)
    short = {full: name for name, full in PROVIDER_NAMES.items()}
    return [short.get(p, p) for p in chosen]


def providers_for_device(device: str) -> tuple[str, ...]:
    """What to ask for on fuse's/profile's ``--device``: cpu, or cuda (then the CPU)."""
    if device not in ("cpu", "cuda"):
        raise UsageError(f"device must be cpu or cuda, got {device!r}")
    return ("cuda", "cpu") if device == "cuda" else ("cpu",)


_PRELOADED: list[str] = []


def preload_gpu_libraries() -> list[str]:
    """Load CUDA/cuDNN for a GPU provider once per process (``onnxruntime.preload_dlls``, ORT >= 1.21).

    A pip-installed onnxruntime-gpu finds the nvidia-* wheels' libraries only this way (or
    after ``import torch``); ORT builds that link the system CUDA (Jetson) need nothing.
    Returns a note the first time the preload fails, else nothing.
    """
    import onnxruntime as ort

    if _PRELOADED:
        return []
    preload = getattr(ort, "preload_dlls", None)
    _PRELOADED.append("tried")
    if preload is None:
        return []
    try:
        preload()
    except Exception as exc:  # noqa: BLE001 - the provider then reports its own failure; keep why
        return [f"onnxruntime.preload_dlls() failed ({type(exc).__name__}: {exc}); the GPU provider may not load"]
    return []


@dataclass
class OrtSession:
    """A built session: ``run(feeds)`` for every output, ``graph_fn()`` for one input -> first output."""

    session: Any
    options: OrtOptions
    providers: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    @property
    def device(self) -> str:
        """Where the session really runs: ``cuda`` only if ORT bound a GPU provider."""
        bound = self.session.get_providers()
        return "cuda" if any(p != CPU_PROVIDER for p in bound) else "cpu"

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        return list(self.session.run(None, dict(feeds)))

    def graph_fn(self) -> GraphFn:
        session = self.session
        name = session.get_inputs()[0].name

        def run(x: np.ndarray) -> np.ndarray:
            out: np.ndarray = session.run(None, {name: x})[0]
            return out

        return run


def ort_session(
    model: bytes | str | Path,
    options: OrtOptions | None = None,
    *,
    providers: Sequence[str] = ("cpu",),
    what: str = "the graph",
    optimized_model_path: Path | None = None,
) -> OrtSession:
    """An ONNX Runtime session on ``model`` (bytes or a path); ModelError naming ``what`` on failure.

    ``optimized_model_path`` asks ORT to save the graph after its rewrites (fuse's portable model).
    """
    import onnxruntime as ort

    opts = options if options is not None else OrtOptions()
    chosen, notes = resolve_providers(providers)
    if len(chosen) > 1:
        notes.extend(preload_gpu_libraries())
    so = session_options(opts)
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    source = model if isinstance(model, bytes) else str(model)
    try:
        session = ort.InferenceSession(source, so, providers=chosen)
    except Exception as exc:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
        raise ModelError(f"{what}: ONNX Runtime cannot load it with {opts.name}: {exc}") from exc
    bound = session.get_providers()
    for wanted in chosen[:-1]:
        if wanted not in bound:  # listed as available but failed to initialise (no driver, no GPU)
            notes.append(f"{wanted} could not be initialised; {what} runs on {bound}")
    if bound and bound[0] != CPU_PROVIDER:
        # Say where it really runs (status pages list these notes), once per provider.
        notes.append(f"ONNX Runtime runs on {bound[0]}")
    return OrtSession(session, opts, bound, notes)
