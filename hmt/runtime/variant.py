"""A bundled variant loaded the way fuse chose to run it: engine, ORT options, threads, layout.

deploy copies fuse's per-variant choice into ``bundle.json`` (``variants[i].extra.runtime``)::

    {"per_graph": {"engine": "onnxruntime", "ort": {"level": "all", "intra_op_threads": 1, ...},
                   "candidate": "ort[all,threads=1](fused)"},
     "merged_chain": {"onnx": "variants/<id>/chain.onnx", "ort": {...}, "candidate": "..."},
     "choice": "merged_chain"}

``per_graph`` is what fuse measured fastest among the candidates that run graph by graph
(the only layout early exit can use); ``merged_chain`` is fuse's single-graph chain of
the variant's full path, present only when deploy bundled it; ``choice`` is fuse's
overall winner. :func:`load_variant` runs the merged chain when fuse chose it and early
exit is off, else the chain graph by graph with fuse's per-graph options. Bundles without
the entry (older deploys) get serve's previous defaults: ORT at level ``all``, one
intra-op thread, no spinning.

Every graph is verified against the bundle's manifest as it is loaded
(:mod:`hmt.runtime.verified`): a file changed on disk since the bundle was built is a
failed load (ArtifactError), never a silently different model.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hmt.bundle import Bundle, BundleVariant, GraphSpec
from hmt.errors import ArtifactError, DeviceError, HmtError, ModelError, UsageError
from hmt.runtime.chain import LAYOUT_CHAIN, LAYOUT_MERGED, ChainRunner, GraphFn, MergedChainRunner, Runner
from hmt.runtime.ort import OrtOptions, ort_session
from hmt.runtime.tvm import tvm_graph_fn
from hmt.runtime.verified import private_copy, read_verified

ENGINES = ("onnxruntime", "tvm")
RUNTIME_KEY = "runtime"
# serve's options when the bundle records none of fuse's: one thread without spinning suits
# the small graphs of a chain and leaves the other cores to the device's own work.
SERVE_DEFAULT_ORT = OrtOptions(level="all", intra_op_threads=1, allow_spinning=False)

_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
           "int32": np.int32, "uint8": np.uint8, "int8": np.int8}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of a bundle ``TensorSpec.dtype``."""
    try:
        return np.dtype(_DTYPES[name])
    except KeyError as exc:
        raise ModelError(f"bundle tensor dtype {name!r} is not supported; expected one of {sorted(_DTYPES)}") from exc


def example_input(bundle: Bundle, rng: np.random.Generator | None = None) -> np.ndarray:
    """An input of the bundle's shape and dtype: seeded noise, or zeros without ``rng``."""
    spec = bundle.spec.input
    dtype = numpy_dtype(spec.dtype)
    if rng is None:
        return np.zeros(spec.shape, dtype=dtype)
    return rng.standard_normal(spec.shape).astype(dtype)


@dataclass(frozen=True)
class VariantRuntime:
    """fuse's choice for one variant, as the bundle records it (see the module docstring)."""

    engine: str | None = None  # per-graph engine fuse measured fastest
    ort: OrtOptions | None = None  # per-graph ORT options
    per_graph_candidate: str | None = None
    merged_onnx: str | None = None
    merged_ort: OrtOptions | None = None
    merged_candidate: str | None = None
    choice: str = LAYOUT_CHAIN  # fuse's overall winner: per_graph or merged_chain
    # Where fuse measured ORT fastest ("cpu" or "cuda"); "cpu" keeps a variant on the host's
    # CPU even where serve offers a GPU provider (small graphs at batch 1 often run faster there).
    ort_device: str | None = None
    merged_ort_device: str | None = None

    @classmethod
    def of(cls, variant: BundleVariant) -> VariantRuntime:
        data = variant.extra.get(RUNTIME_KEY)
        if data is None:
            return cls()
        where = f"bundle.json: variant {variant.arch_id!r} extra.{RUNTIME_KEY}"
        if not isinstance(data, Mapping):
            raise ArtifactError(f"{where}: expected an object")
        try:
            per_graph = data.get("per_graph") or {}
            merged = data.get("merged_chain") or {}
            engine = per_graph.get("engine")
            if engine is not None and engine not in ENGINES:
                raise UsageError(f"engine {engine!r} is not one of {list(ENGINES)}")
            choice = str(data.get("choice", LAYOUT_CHAIN))
            if choice not in (LAYOUT_CHAIN, LAYOUT_MERGED):
                raise UsageError(f"choice {choice!r} is not {LAYOUT_CHAIN} or {LAYOUT_MERGED}")
            return cls(
                engine=engine,
                ort=OrtOptions.from_mapping(per_graph["ort"], f"{where}.per_graph.ort") if "ort" in per_graph else None,
                per_graph_candidate=per_graph.get("candidate"),
                merged_onnx=None if not merged else str(merged["onnx"]),
                merged_ort=OrtOptions.from_mapping(merged["ort"], f"{where}.merged_chain.ort") if merged else None,
                merged_candidate=merged.get("candidate") if merged else None,
                choice=choice if merged or choice == LAYOUT_CHAIN else LAYOUT_CHAIN,
                ort_device=_ort_device(per_graph.get("ort_device")),
                merged_ort_device=_ort_device(merged.get("ort_device")) if merged else None,
            )
        except (HmtError, KeyError, TypeError, AttributeError) as exc:
            raise ArtifactError(f"{where}: malformed ({exc})") from exc


def _ort_device(value: Any) -> str | None:
    if value is not None and value not in ("cpu", "cuda"):
        raise UsageError(f"ort_device {value!r} is not cpu or cuda")
    return None if value is None else str(value)


def bundle_providers(bundle: Bundle) -> tuple[str, ...]:
    """The ORT providers ``bundle``'s target lists (``bundle.json`` target.providers), in
    order; ``("cpu",)`` for bundles from before targets listed them."""
    from hmt.runtime.ort import PROVIDER_NAMES

    listed = bundle.spec.target.get("providers")
    if listed is None:
        return ("cpu",)
    if not isinstance(listed, (list, tuple)) or not listed or not all(p in PROVIDER_NAMES for p in listed):
        raise ArtifactError(f"{bundle.root / 'bundle.json'}: target.providers must be a non-empty list of "
                            f"{sorted(PROVIDER_NAMES)}, got {listed!r}")
    return tuple(str(p) for p in listed)


def providers_as_measured(providers: Sequence[str], ort_device: str | None) -> tuple[str, ...]:
    """``providers`` narrowed to the CPU where fuse measured the CPU fastest."""
    return ("cpu",) if ort_device == "cpu" else tuple(providers)


def narrowed_note(providers: Sequence[str], ort_device: str | None) -> str | None:
    """What :func:`providers_as_measured` left out, said once for the runner's notes (None: nothing).

    Without it a Jetson bundle's status listed tensorrt and cuda while every session ran on the CPU.
    """
    dropped = [p for p in providers if p not in ("cpu", "CPUExecutionProvider")] if ort_device == "cpu" else []
    if not dropped:
        return None
    return (f"fuse timed this variant with ONNX Runtime on the CPU (ort_device cpu), so it runs on the CPU "
            f"provider only; {', '.join(dropped)} not tried")


def runtime_available(engine: str) -> bool:
    """Whether ``engine``'s runtime can be imported here (without importing it)."""
    module = {"onnxruntime": "onnxruntime", "tvm": "tvm"}.get(engine)
    if module is None:
        raise UsageError(f"unknown engine {engine!r}; expected onnxruntime or tvm")
    return importlib.util.find_spec(module) is not None


def resolve_engine(requested: str, variant: BundleVariant) -> str:
    """The engine to run ``variant`` with for ``requested`` (``auto``, ``onnxruntime`` or ``tvm``).

    ``auto`` takes fuse's per-graph choice, else the variant's ``preferred_engine``, when
    its runtime imports here and the bundle has its files; else ONNX Runtime.
    """
    if requested == "auto":
        fuse_engine = VariantRuntime.of(variant).engine
        for candidate in (fuse_engine, variant.preferred_engine):
            if candidate is not None and candidate in variant.engines and runtime_available(candidate):
                return candidate
        return "onnxruntime"
    if requested not in ENGINES:
        raise UsageError(f"engine must be auto, onnxruntime or tvm, got {requested!r}")
    if requested == "tvm" and "tvm" not in variant.engines:
        raise UsageError(f"variant {variant.arch_id!r} has no TVM libraries in this bundle (engines: "
                         f"{list(variant.engines)}); use --engine onnxruntime or auto")
    if not runtime_available(requested):
        raise DeviceError(f"engine {requested!r} requested but its runtime is not installed here")
    return requested


def within_share(options: OrtOptions, max_threads: int | None) -> tuple[OrtOptions, str | None]:
    """fuse's ORT ``options`` cut to serve's share of the CPU: at most ``max_threads`` threads a
    graph (``intra_op_threads`` 0, ORT's default, is one per core, so it is cut too), and no
    spinning once cut. fuse measured its choice alone on an idle machine; a serving process runs
    several requests at once beside the device's own work, and an operator split over more threads
    than its share waits for the slowest of them, each time-sliced against that other work
    (``benchmarks/serve/results/threads_ab.json``). Returns the options and a note when they were
    cut (None: kept as measured)."""
    if max_threads is None or max_threads < 1:
        return options, None
    threads = options.intra_op_threads
    if 0 < threads <= max_threads:
        return options, None
    inter = options.inter_op_threads
    if options.execution_mode != "sequential" and not 0 < inter <= max_threads:
        inter = max_threads
    cut = replace(options, intra_op_threads=max_threads, inter_op_threads=inter, allow_spinning=False)
    was = "the runtime's default" if threads == 0 else str(threads)
    return cut, f"intra-op threads {was} -> {max_threads} without spinning (serve's share of the CPU)"


def graph_fn(bundle: Bundle, spec: GraphSpec, engine: str, threads: int | None = None, *,
             ort: OrtOptions | None = None, providers: Sequence[str] = ("cpu",),
             notes: list[str] | None = None) -> GraphFn:
    """One graph of ``bundle``, verified against the manifest now, loaded with ``engine``.

    ``threads`` (when given) overrides the ORT options' intra-op threads, or sets TVM's pool.
    """
    if engine == "tvm":
        if spec.tvm is None:
            raise ModelError(f"graph {spec.onnx} has no TVM library in this bundle")
        with private_copy(bundle.artifact, spec.tvm) as (path, digest):
            return tvm_graph_fn(path, 1 if threads is None else threads, sha256=digest)
    options = ort if ort is not None else SERVE_DEFAULT_ORT
    if threads is not None:
        options = replace(options, intra_op_threads=threads)
    session = ort_session(read_verified(bundle.artifact, spec.onnx), options, providers=providers,
                          what=str(bundle.root / spec.onnx))
    if notes is not None:
        notes.extend(n for n in session.notes if n not in notes)
    return session.graph_fn()


def load_variant(
    bundle: Bundle,
    arch_id: str,
    engine: str = "auto",
    threads: int | None = None,
    *,
    early_exit: bool = True,
    providers: Sequence[str] = ("cpu",),
    max_threads: int | None = None,
) -> Runner:
    """``arch_id`` of ``bundle`` loaded as fuse chose (see the module docstring).

    ``threads=None`` keeps fuse's thread count (serve's default of 1 when the bundle has
    none), cut to ``max_threads`` when given (:func:`within_share`); a number overrides both.
    ArtifactError when a graph changed on disk since the bundle was built; ModelError when a
    runtime cannot load it.
    """
    if threads is not None and threads < 0:
        raise UsageError(f"threads must be >= 0 (0: the runtime's default), got {threads}")
    variant = bundle.spec.variant(arch_id)
    runtime = VariantRuntime.of(variant)
    chosen = resolve_engine(engine, variant)
    notes: list[str] = []
    if (chosen == "onnxruntime" and not early_exit and runtime.choice == LAYOUT_MERGED
            and runtime.merged_onnx is not None and variant.exit_stage == len(variant.segments) - 1):
        options = runtime.merged_ort or SERVE_DEFAULT_ORT
        if threads is not None:
            options = replace(options, intra_op_threads=threads)
        else:
            options, note = within_share(options, max_threads)
            notes.extend([note] if note else [])
        session = ort_session(read_verified(bundle.artifact, runtime.merged_onnx), options,
                              providers=providers_as_measured(providers, runtime.merged_ort_device),
                              what=str(bundle.root / runtime.merged_onnx))
        narrowed = narrowed_note(providers, runtime.merged_ort_device)
        notes.extend([narrowed] if narrowed else [])
        notes.extend(session.notes)
        notes.append(f"fuse's merged chain ({runtime.merged_candidate or options.name}): one call per input")
        return MergedChainRunner(variant, session.graph_fn(), "onnxruntime", notes)
    ort = runtime.ort if chosen == runtime.engine or runtime.engine is None else None
    if ort is not None:
        narrowed = narrowed_note(providers, runtime.ort_device)
        notes.extend([narrowed] if narrowed else [])
        providers = providers_as_measured(providers, runtime.ort_device)
        if threads is None:
            ort, note = within_share(ort, max_threads)
            notes.extend([note] if note else [])
    n = variant.exit_stage + 1
    segments = [graph_fn(bundle, g, chosen, threads, ort=ort, providers=providers, notes=notes)
                for g in variant.segments[:n]]
    exits = [graph_fn(bundle, g, chosen, threads, ort=ort, providers=providers, notes=notes)
             for g in variant.exits[:n]]
    if chosen == "onnxruntime" and ort is not None:
        notes.append(f"fuse's per-graph choice {runtime.per_graph_candidate or ort.name}")
    return ChainRunner(variant, segments, exits, chosen, notes)
