"""Deploy's inputs: the fused artifact's variants, the pareto front's metrics, lineage, profile.

Everything is read by path and verified (checksums, kinds); nothing is found by magic,
except the parent ``converted`` artifact the fused manifest names, which is read only to
check lineage (and skipped, with a note, when it is gone or was rebuilt).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hmt.artifacts import Artifact, load_artifact
from hmt.bundle import SEQUENCE_LAYOUT, GraphSpec, Preprocess, TensorSpec
from hmt.errors import ArtifactError, InputError, ModelError, UsageError

FUSED_KIND = "fused"
FUSED_REPORT = "report.json"
# Bundle folders are named by arch id: keep them plain file names.
_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class FusedGraph:
    role: str  # "segment" or "exit"
    index: int
    onnx: str  # path inside the fused artifact
    input: TensorSpec
    output: TensorSpec


@dataclass(frozen=True)
class FusedVariant:
    """One variant of the fused artifact as deploy needs it: its chain and fuse's engine choice."""

    name: str
    arch_id: str
    segments: tuple[FusedGraph, ...]
    exits: tuple[FusedGraph, ...]
    fuse_engine: str  # "onnxruntime" or "tvm": what fuse measured fastest on the build host
    fuse_candidate: str
    # fuse's report entries: the overall winner and the fastest graph-by-graph candidate
    # (what serve runs with early exit); see :func:`runtime_entry`.
    choice: dict[str, Any] = field(default_factory=dict)
    choice_per_graph: dict[str, Any] = field(default_factory=dict)

    def graphs(self) -> tuple[FusedGraph, ...]:
        return (*self.segments, *self.exits)


def _tensor(data: Any, where: str) -> TensorSpec:
    if not isinstance(data, Mapping):
        raise ArtifactError(f"{where}: expected {{name, shape, dtype}}")
    return TensorSpec.from_mapping(data, where)


def read_fused_variants(fused: Artifact) -> list[FusedVariant]:
    """The segmented variants of a fused artifact, with the fused ONNX file of every graph."""
    report = fused.read_json(FUSED_REPORT)
    where = str(fused.root / FUSED_REPORT)
    if not isinstance(report, dict) or not isinstance(report.get("variants"), list):
        raise ArtifactError(f"{where}: expected an object with a 'variants' list")
    variants = []
    for i, entry in enumerate(report["variants"]):
        at = f"{where}: variants[{i}]"
        name = str(entry.get("name"))
        chain = entry.get("chain")
        if not chain:
            raise InputError(f"{at} ({name}) is a single graph without early-exit segments; deploy bundles "
                             "segmented variants (convert them from a supernet: hmt convert --supernet ...)")
        fused_onnx = {g.get("file"): (g.get("onnx") or {}).get("file") for g in entry.get("graphs", [])}

        def graph(item: Mapping[str, Any], role: str, at: str = at, name: str = name,
                  fused_onnx: dict[Any, Any] = fused_onnx) -> FusedGraph:
            onnx_file = fused_onnx.get(item.get("file"))
            if not onnx_file:
                raise InputError(f"{at} ({name}): no fused ONNX for {item.get('file')!r}; fuse ran without the "
                                 "ort engine. Rerun `hmt fuse CONVERTED --engine ort --engine tvm --out ...`")
            fused.file(str(onnx_file))  # listed in the manifest (checked on load)
            return FusedGraph(role, int(item["index"]), str(onnx_file),
                              _tensor(item.get("input"), f"{at}.chain {item.get('file')}.input"),
                              _tensor(item.get("output"), f"{at}.chain {item.get('file')}.output"))

        try:
            segments = tuple(graph(s, "segment") for s in chain["segments"])
            exits = tuple(graph(e, "exit") for e in chain["exits"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{at}: malformed chain ({exc})") from exc
        choice = entry.get("choice") or {}
        engine = {"ort": "onnxruntime", "tvm": "tvm"}.get(str(choice.get("engine")), "onnxruntime")
        arch_id = str(entry.get("arch_id") or name)
        if not _SAFE_ID.match(arch_id):
            raise InputError(f"{at}: variant id {arch_id!r} is not a plain file name (letters, digits, . _ -)")
        per_graph = entry.get("choice_per_graph") or {}
        variants.append(FusedVariant(name, arch_id, segments, exits, engine, str(choice.get("candidate", "")),
                                     dict(choice), dict(per_graph) if isinstance(per_graph, Mapping) else {}))
    if not variants:
        raise InputError(f"{where}: lists no variants")
    return variants


def select_variants(fused: Sequence[FusedVariant], wanted: Sequence[str]) -> list[FusedVariant]:
    """The variants named in ``wanted`` (arch id or fused name), or every one when empty."""
    if not wanted:
        return list(fused)
    chosen: list[FusedVariant] = []
    for key in wanted:
        match = next((v for v in fused if key in (v.arch_id, v.name)), None)
        if match is None:
            known = ", ".join(v.arch_id for v in fused)
            raise UsageError(f"--variant {key!r} is not in the fused artifact; it has: {known}")
        if match not in chosen:
            chosen.append(match)
    return chosen


def drop_slower_quantised(chosen: Sequence[FusedVariant], fused: Sequence[FusedVariant], *,
                          named: Sequence[str] = ()) -> tuple[list[FusedVariant], list[str]]:
    """``chosen`` less every quantised variant that fuse measured no faster than its fp32 twin.

    A variant the user named (``named``: deploy's ``--variant`` ids or names) is kept, with a
    note saying what fuse measured: an explicit request is not second-guessed by a timing
    that, on a tiny graph, is within the machine's noise.

    A quantised copy is worth bundling for its speed (pareto admits only copies it measured
    faster, ``hmt.pareto.precision``); where the fp32 twin was fused in the same run, both
    chosen medians come from one machine and one session, and an int8 copy no faster than
    fp32 there (tiny variants: quantise/dequantise and layout changes cost more than the
    integer kernels save) is left out, with a note saying so. A copy whose twin is not in the
    fused artifact is kept (nothing here to compare it with).
    """
    from hmt.precision import FP32, split_variant_id

    by_id = {v.arch_id: v for v in fused}
    kept: list[FusedVariant] = []
    notes: list[str] = []
    for variant in chosen:
        base, precision = split_variant_id(variant.arch_id)
        twin = by_id.get(base)
        mine, theirs = variant.choice.get("median_ms"), twin.choice.get("median_ms") if twin else None
        if (precision != FP32 and isinstance(mine, (int, float)) and isinstance(theirs, (int, float))
                and mine >= theirs):
            measured = f"fuse measured it no faster than its fp32 twin {base} on the build host " \
                       f"({mine:.4g} ms vs {theirs:.4g} ms)"
            if variant.arch_id in named or variant.name in named:
                notes.append(f"variant {variant.arch_id} kept as asked (--variant), although {measured}")
            else:
                notes.append(f"variant {variant.arch_id} left out: {measured}")
                continue
        kept.append(variant)
    if not kept:
        raise UsageError("no variant left to bundle: " + "; ".join(notes))
    return kept, notes


def front_points(front_doc: Mapping[str, Any], pareto_root: Path) -> dict[str, Mapping[str, Any]]:
    points = front_doc.get("points")
    if not isinstance(points, list):
        raise ArtifactError(f"{pareto_root / 'front.json'}: 'points' must be a list")
    return {str(p.get("arch_id")): p for p in points if isinstance(p, Mapping)}


def match_points(variants: Sequence[FusedVariant], points: Mapping[str, Mapping[str, Any]],
                 *, fused_root: Path, pareto_root: Path, supernet_hint: str) -> None:
    """Refuse a fused variant that is not on the pareto front (its metrics would be unknown)."""
    missing = [v.arch_id for v in variants if v.arch_id not in points]
    if missing:
        raise InputError(
            f"{fused_root}: variant(s) {', '.join(missing)} are not on the pareto front in {pareto_root} "
            f"(front: {', '.join(sorted(points)) or 'empty'}); deploy takes their accuracy and predicted "
            f"latency/energy/memory from the front. Convert the front's variants with "
            f"`hmt convert --supernet {supernet_hint} --pareto {pareto_root} --out ...`, fuse them, and deploy "
            "again (or pick front variants with --variant)")
    for v in variants:
        point = points[v.arch_id]
        where = f"{pareto_root / 'front.json'}: point {v.arch_id}"
        try:
            exit_stage = int(point["exit_stage"])
            per_exit = list(point["accuracy_per_exit"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: lacks exit_stage/accuracy_per_exit ({exc})") from exc
        if not 0 <= exit_stage < len(v.segments) or len(per_exit) > len(v.segments):
            raise InputError(f"{where}: exit_stage {exit_stage} with {len(per_exit)} exit accuracies does not fit "
                             f"the fused chain of {len(v.segments)} segment(s); the artifacts describe different "
                             "variants")


def _parent(artifact: Artifact, kind: str) -> Any:
    return next((p for p in artifact.manifest.parents if p.kind == kind), None)


def check_lineage(fused: Artifact, pareto: Artifact) -> str:
    """fused -> converted -> supernet vs pareto -> supernet; refuses a mismatch, else says what was checked."""
    converted_ref = _parent(fused, "converted")
    if converted_ref is None:
        return "not checked: the fused manifest records no converted parent"
    from hmt.artifacts.lineage import find_parent

    converted = find_parent(fused, converted_ref, verify_checksums=False)
    if converted is None:
        return (f"not checked: the converted artifact {converted_ref.path} (relative to {fused.root}) named by the "
                "fused manifest is gone or was rebuilt after fuse read it (manifest sha256 differs)")
    ours, theirs = _parent(converted, "supernet"), _parent(pareto, "supernet")
    if ours is None or theirs is None:
        side = "converted" if ours is None else "pareto"
        return f"not checked: the {side} artifact records no supernet parent (a user model?)"
    if ours.manifest_sha256 != theirs.manifest_sha256:
        raise InputError(
            f"lineage mismatch: {fused.root} was fused from {converted.root}, converted from supernet {ours.path} "
            f"(manifest sha256 {ours.manifest_sha256[:12]}), but the pareto front {pareto.root} was searched on "
            f"supernet {theirs.path} ({theirs.manifest_sha256[:12]}); deploy artifacts of one supernet")
    note = f"checked: fused -> converted -> supernet {ours.manifest_sha256[:12]} = pareto's supernet"
    pareto_ref = _parent(converted, "pareto")
    if pareto_ref is not None and pareto_ref.manifest_sha256 != pareto.manifest_sha256:
        note += f" (the variants were converted from another front, {pareto_ref.path}, of the same supernet)"
    return note


def supernet_hint(pareto: Artifact) -> str:
    ref = _parent(pareto, "supernet")
    return str(ref.path) if ref is not None else "SUPERNET"


def read_profile(path: Path) -> tuple[bytes, dict[str, Any], Artifact | None]:
    """A validated profile as single-file JSON bytes, its document, and its artifact (if a directory)."""
    from hmt.profile.schema import ARTIFACT_KIND, PROFILE_FILE, load_profile, profile_to_json_files

    profile = load_profile(path)
    data = profile_to_json_files(profile, inline=True)[PROFILE_FILE]
    artifact = load_artifact(path, kind=ARTIFACT_KIND) if Path(path).is_dir() else None
    return data, json.loads(data), artifact


def profile_threads(doc: Mapping[str, Any]) -> tuple[int | None, list[str]]:
    """The ONNX Runtime thread count a device profile was measured (or estimated) with, and deploy's note
    saying the bundle runs it; None (no note) when it records none (0: the engine's default) or profiles
    another engine."""
    device = doc.get("device") or {}
    threads = device.get("threads")
    if device.get("engine") != "onnxruntime" or not isinstance(threads, int) or threads < 1:
        return None, []
    return threads, [f"ONNX Runtime runs {threads} intra-op thread(s), the device profile's count (fuse's "
                     "was the build machine's)"]


def graph_spec(graph: FusedGraph, *, onnx: str, tvm: str | None) -> GraphSpec:
    return GraphSpec(index=graph.index, input=graph.input, output=graph.output, onnx=onnx, tvm=tvm,
                     consumes_segment=graph.index if graph.role == "exit" else None)


MERGED_CHAIN_FILE = "chain.onnx"
_ENGINE_NAMES = {"ort": "onnxruntime", "tvm": "tvm"}


def runtime_entry(variant: FusedVariant, *, exit_stage: int, folder: str, engines: Sequence[str],
                  threads: int | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """fuse's run-time choice as ``bundle.json`` records it (``extra.runtime``, read by
    :class:`hmt.runtime.variant.VariantRuntime`), and the fused file of the merged chain to
    copy to ``<folder>/chain.onnx`` (None when not bundled). ``threads``: ORT's intra-op thread
    count in place of fuse's, which the build machine measured (the device profile's count).

    The merged chain is bundled only when fuse chose it and its path (every segment, then
    the last head) is the variant's: a variant stopping at an earlier exit runs another graph.
    """
    per_graph = variant.choice_per_graph
    if not per_graph:
        return None, None  # a fused artifact from before fuse recorded it: serve keeps its defaults
    engine = _ENGINE_NAMES.get(str(per_graph.get("engine")))
    entry: dict[str, Any] = {"per_graph": {"engine": engine if engine in engines else "onnxruntime",
                                           "candidate": per_graph.get("candidate")},
                             "choice": "per_graph"}
    if engine == "onnxruntime" and isinstance(per_graph.get("ort"), Mapping):
        entry["per_graph"]["ort"] = dict(per_graph["ort"])
        if per_graph.get("ort_device") in ("cpu", "cuda"):
            entry["per_graph"]["ort_device"] = per_graph["ort_device"]
    choice = variant.choice
    merged_source: str | None = None
    if (choice.get("graphs") == "chain" and choice.get("onnx") and isinstance(choice.get("ort"), Mapping)
            and exit_stage == len(variant.segments) - 1):
        merged_source = str(choice["onnx"])
        entry["merged_chain"] = {"onnx": f"{folder}/{MERGED_CHAIN_FILE}", "ort": dict(choice["ort"]),
                                 "candidate": choice.get("candidate")}
        if choice.get("ort_device") in ("cpu", "cuda"):
            entry["merged_chain"]["ort_device"] = choice["ort_device"]
        entry["choice"] = "merged_chain"
    if threads:
        for key in ("per_graph", "merged_chain"):
            if isinstance(entry.get(key, {}).get("ort"), dict):
                entry[key]["ort"]["intra_op_threads"] = threads
    return entry, merged_source


def _dataset_meta(dataset: Mapping[str, Any]) -> tuple[Preprocess | None, tuple[str, ...] | None]:
    names = None if dataset.get("class_names") is None else tuple(str(n) for n in dataset["class_names"])
    mean, std = tuple(float(v) for v in dataset["mean"]), tuple(float(v) for v in dataset["std"])
    if dataset.get("modality") == "sequence":  # standardized per channel in training: serve can do it for raw inputs
        return Preprocess(mean=mean, std=std, layout=SEQUENCE_LAYOUT, pixel_scale=1.0), names
    if dataset.get("modality") != "image":
        return None, names
    return Preprocess(mean=mean, std=std, layout="NCHW", pixel_scale=255.0), names


def input_meta(front: Any) -> tuple[Preprocess | None, tuple[str, ...] | None, str | None, bool]:
    """The input's preprocessing and class names: from the front's dataset record, else from the
    supernet it was searched on (found relative to the front and checked by manifest sha256).

    Returns (preprocess, class names, note, known): ``known`` is False when neither could be
    read; serve would then assume CIFAR-10's normalisation for a 3-channel image input."""
    from hmt.artifacts.lineage import find_parent
    from hmt.errors import HmtError

    doc = front.doc
    try:
        if isinstance(doc.get("dataset"), Mapping):
            return (*_dataset_meta(doc["dataset"]), None, True)
        record = next((p for p in front.artifact.manifest.parents if p.kind == "supernet"), None)
        if record is None:
            return None, None, "no supernet recorded: the bundle carries no preprocessing or class names", False
        supernet = find_parent(front.artifact, record)
        if supernet is None:
            return None, None, (f"the supernet the front was searched on ({record.path}, relative to "
                                f"{front.artifact.root}) was not found: no preprocessing or class names"), False
        return (*_dataset_meta(supernet.read_json("supernet.json")["dataset"]), None, True)
    except (HmtError, KeyError, TypeError, ValueError) as exc:
        return None, None, f"dataset record of the front's supernet unreadable ({exc}): no preprocessing", False


def checked_input_meta(front: Any, allow_missing: bool
                       ) -> tuple[Preprocess | None, tuple[str, ...] | None, str | None]:
    """The front's preprocessing and class names, and a note on what is missing; refused when
    something is missing, unless ``allow_missing`` (``--no-preprocess``): serve would normalise
    with defaults and answer without class names."""
    preprocess, class_names, meta_note, meta_known = input_meta(front)
    if not meta_known and not allow_missing:
        raise InputError(f"{meta_note}; serve would normalise inputs with defaults and answer without class "
                         "names. Search the front with this hmt (pareto records the dataset), keep the supernet "
                         "beside it, or pass --no-preprocess to build the bundle anyway")
    return preprocess, class_names, meta_note


def one_input_and_classes(variants: list[FusedVariant]) -> tuple[Any, int]:
    """The first segment (its input is the bundle's) and the class count, the same for every variant."""
    first = variants[0].segments[0]
    classes = variants[0].exits[0].output.shape[-1]
    for v in variants:
        if v.segments[0].input != first.input or any(e.output.shape[-1] != classes for e in v.exits):
            raise ModelError(f"variant {v.arch_id} takes {v.segments[0].input} / gives {classes} classes unlike "
                             f"{variants[0].arch_id}; a bundle serves one input and one set of classes")
    return first, int(classes)


def selected_variants(fused: Any, front: Any, names: Sequence[str], energy_budget: float | None
                      ) -> tuple[list[FusedVariant], dict[str, Any], list[str], Any]:
    """The fused variants to bundle (``names``: deploy --variants, empty: every fused variant), matched to
    their front points: (variants, points by arch id, notes on quantised variants dropped as slower,
    lineage). An energy budget needs the front's energies in mJ."""
    energy_unit = str((front.doc.get("units") or {}).get("energy", "unknown"))
    if energy_budget is not None and energy_unit != "mJ":
        raise UsageError(f"--energy-mj {energy_budget:g}: the front's energies are in {energy_unit} (pareto ran on a "
                         "profile with an uncalibrated energy model); an energy budget is in mJ per inference and "
                         "needs a profile calibrated with a power source (hmt profile-device --power ...)")
    lineage = check_lineage(fused, front.artifact)
    all_fused = read_fused_variants(fused)
    variants, slower_notes = drop_slower_quantised(select_variants(all_fused, names), all_fused, named=names)
    points = front_points(front.doc, front.artifact.root)
    match_points(variants, points, fused_root=fused.root, pareto_root=front.artifact.root,
                 supernet_hint=supernet_hint(front.artifact))
    return variants, points, slower_notes, lineage
