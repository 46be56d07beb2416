"""``deploy``: a fused artifact + a pareto front -> a checksummed bundle for one target.

The bundle (layout in :mod:`hmt.bundle`) holds, per chosen variant, its chain of segments
and exit heads as ONNX (for ONNX Runtime, and for on-device TensorRT on Jetsons) and as
TVM shared libraries cross-compiled for the target's CPU; the device profile; the runtime
index restricted to the bundled variants; the serve config; and the manifest (sha256 of
every file, the target, the versions that built it). A ``<out>.tar.gz`` is written beside
the directory, from the finished bundle before it is swapped into place, and committed
with it (a kill never leaves an archive of another build beside the directory). With a
signing key, ``manifest.sig`` (ed25519 over the manifest) goes into both.

A variant whose TVM build fails for the target is bundled with ONNX Runtime only and the
failure is reported (bundle notes, manifest metrics, the result); with ``strict`` the
whole bundle fails instead and nothing is written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hmt import __version__
from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.artifacts.signing import load_private_key, sign_artifact_dir
from hmt.bundle import (
    BUNDLE_KIND,
    BUNDLE_SPEC_NAME,
    ENGINES,
    INDEX_NAME,
    PROFILE_NAME,
    SERVE_CONFIG_NAME,
    BundleSpec,
    BundleVariant,
    GraphSpec,
    variant_dir,
)
from hmt.deploy.archive import archive_path_for, build_archive_file, is_bundle_archive
from hmt.deploy.notes import budget_notes, quantised_notes, target_notes
from hmt.deploy.sources import (
    FUSED_KIND,
    FusedVariant,
    checked_input_meta,
    graph_spec,
    one_input_and_classes,
    profile_threads,
    read_profile,
    runtime_entry,
    selected_variants,
)
from hmt.deploy.targets import Target, default_profile_path, get_target
from hmt.errors import ModelError, UsageError
from hmt.progress import ProgressCallback, no_progress


@dataclass(frozen=True)
class DeployOptions:
    target: str
    profile: Path | None = None  # None: the target's shipped profile
    variants: tuple[str, ...] = ()  # arch ids (or fused names); empty: every fused variant
    # None: every engine the target can run (TVM only where the device has a TVM runtime).
    engines: tuple[str, ...] | None = None
    strict: bool = False
    latency_ms: float | None = None
    memory_mb: float | None = None
    energy: float | None = None
    archive: bool = True
    sign_key: Path | None = None  # ed25519 private key (PEM): sign the manifest
    version: int = 0  # the release version the signature binds (serve refuses roll-backs below it)
    # BN-adaptable graphs per fp32 variant for serve --adapt (hmt.deploy.adaptable); the
    # supernet is the front's unless given.
    adaptable: bool = False
    # With adaptable: a labelled .npz (x, y) whose seeded subset ships as adapt/canary.npz, the set
    # serve --adapt checks adoptions against by default.
    canary_data: Path | None = None
    # Also ship the variants as shared block graphs (hmt.deploy.blocks) for serve --blocks, with
    # a labelled calibration set (x, y) for on-device re-search when given.
    blocks: bool = False
    blocks_data: Path | None = None
    seed: int = 0
    supernet: Path | None = None
    # A bundle whose input preprocessing is unknown is refused (serve would normalise images
    # with defaults: wrong answers, silently) unless this says the user accepts it.
    allow_missing_preprocess: bool = False


@dataclass(frozen=True)
class VariantBuild:
    arch_id: str
    engines: tuple[str, ...]
    preferred_engine: str
    graphs: int
    compile_s: float
    size_bytes: int
    tvm_error: str | None = None


@dataclass(frozen=True)
class DeployResult:
    out_dir: Path
    archive: Path | None
    target: Target
    variants: tuple[VariantBuild, ...]
    notes: tuple[str, ...]
    lineage: str
    size_bytes: int
    archive_size_bytes: int | None
    compile_s: float
    build_s: float
    profile_id: str
    failures: dict[str, str] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out_dir),
            "archive": str(self.archive) if self.archive else None,
            "target": self.target.name,
            "profile": self.profile_id,
            "variants": [vars(v) | {"engines": list(v.engines)} for v in self.variants],
            "notes": list(self.notes),
            "lineage": self.lineage,
            "size_bytes": self.size_bytes,
            "archive_size_bytes": self.archive_size_bytes,
            "compile_s": round(self.compile_s, 3),
            "build_s": round(self.build_s, 3),
            "tvm_failures": self.failures,
        }


def _compiler_version(target: Target) -> str | None:
    try:
        done = subprocess.run([target.compiler(), "--version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0] if lines else None


def _build_variant(writer: ArtifactWriter, variant: FusedVariant, point: Mapping[str, Any], *, fused: Any,
                   target: Target, engines: tuple[str, ...], strict: bool, progress: ProgressCallback,
                   done: list[int], total: int, ort_session: Mapping[str, Any] | None = None,
                   threads: int | None = None
                   ) -> tuple[BundleVariant, VariantBuild]:
    from hmt.deploy.compile import compile_graph

    folder = variant_dir(variant.arch_id)
    specs: dict[tuple[str, int], GraphSpec] = {}
    tvm_error: str | None = None
    compile_s = 0.0
    size_bytes = 0
    libraries: list[Path] = []
    for graph in variant.graphs():
        stem = f"{graph.role}_{graph.index}"
        onnx_rel = f"{folder}/{stem}.onnx"
        shutil.copyfile(fused.file(graph.onnx), writer.path(onnx_rel))
        size_bytes += writer.path(onnx_rel).stat().st_size
        tvm_rel: str | None = None
        if "tvm" in engines and tvm_error is None:
            tvm_rel = f"{folder}/{stem}.so"
            progress("compile", done[0], total, f"{variant.arch_id}/{stem}")
            try:
                compile_s += compile_graph(writer.path(onnx_rel), target, writer.path(tvm_rel))
                libraries.append(writer.path(tvm_rel))
            except ModelError as exc:
                if strict:
                    raise ModelError(f"variant {variant.arch_id} does not compile for {target.name} "
                                     f"(--strict): {exc}") from exc
                tvm_error = str(exc)
        done[0] += 1
        specs[(graph.role, graph.index)] = graph_spec(graph, onnx=onnx_rel, tvm=tvm_rel)
    if tvm_error is not None:
        # ONNX Runtime only: drop the libraries already built so the chain is all or nothing.
        for library in libraries:
            library.unlink(missing_ok=True)
        specs = {k: GraphSpec(s.index, s.input, s.output, s.onnx, None, s.consumes_segment) for k, s in specs.items()}
        progress("compile", done[0], total, f"{variant.arch_id}: TVM failed, ONNX Runtime only")
    else:
        size_bytes += sum(p.stat().st_size for p in libraries)
    bundled_engines = tuple(e for e in engines if e != "tvm" or tvm_error is None)
    preferred = variant.fuse_engine if variant.fuse_engine in bundled_engines else bundled_engines[0]
    runtime, merged_source = runtime_entry(variant, exit_stage=int(point["exit_stage"]), folder=folder,
                                           engines=bundled_engines, threads=threads)
    if merged_source is not None and runtime is not None:  # fuse's merged chain: what serve runs without early exit
        shutil.copyfile(fused.file(merged_source), writer.path(runtime["merged_chain"]["onnx"]))
        size_bytes += writer.path(runtime["merged_chain"]["onnx"]).stat().st_size
    extra = {
        "fused_name": variant.name,
        # fp32 / int8 / fp16 (hmt.precision): a quantised variant is one more variant to serve.
        "precision": point.get("precision", "fp32"),
        # The ORT session settings fuse measured fastest graph by graph (threads, parallel mode),
        # for a runtime that rebuilds them (hmt.fuse.engines.ort.OrtConfig(**ort_session)).
        "ort_session": dict(ort_session) if ort_session else None,
        "fuse_choice": variant.fuse_candidate,
        "predicted_for": point.get("predicted_for"),
        "macs": point.get("macs"),
        "params": point.get("params"),
        "compile_s": round(compile_s, 3),
        "tvm_error": tvm_error,
        "runtime": runtime,
    }
    bundle_variant = BundleVariant(
        arch_id=variant.arch_id,
        exit_stage=int(point["exit_stage"]),
        accuracy=float(point["accuracy"]),
        accuracy_per_exit=tuple(float(a) for a in point["accuracy_per_exit"]),
        latency_ms=float(point["latency_ms"]),
        energy=float(point["energy"]),
        memory_mb=float(point["memory_mb"]),
        segments=tuple(specs[("segment", g.index)] for g in variant.segments),
        exits=tuple(specs[("exit", g.index)] for g in variant.exits),
        preferred_engine=preferred,
        engines=bundled_engines,
        extra={k: v for k, v in extra.items() if v is not None},
    )
    build = VariantBuild(variant.arch_id, bundled_engines, preferred, len(specs), compile_s, size_bytes, tvm_error)
    return bundle_variant, build


def _ort_sessions(fused: Any) -> dict[str, Mapping[str, Any]]:
    """Fused name -> the ORT settings of fuse's per-graph choice, where that choice is an ORT candidate."""
    report = fused.read_json("report.json")
    out: dict[str, Mapping[str, Any]] = {}
    for entry in report.get("variants", []) if isinstance(report, dict) else []:
        choice = entry.get("choice_per_graph") or {}
        if choice.get("engine") == "ort" and isinstance(choice.get("ort"), Mapping):
            out[str(entry.get("name"))] = choice["ort"]
    return out


def resolve_engines(options: DeployOptions, target: Target) -> tuple[tuple[str, ...], list[str]]:
    """The engines to bundle and the notes saying what was left out.

    Left to the default, TVM is bundled only for a target whose device can install a TVM
    runtime; asked for by name (``--engine tvm``) for one that cannot, it is refused here,
    before any work: a bundle never holds a library its device cannot load.
    """
    if options.engines is None:
        if target.runs_tvm:
            return ENGINES, []
        return tuple(e for e in ENGINES if e != "tvm"), [f"TVM left out for {target.name}: {target.no_tvm_reason}"]
    if "tvm" in options.engines and not target.runs_tvm:
        raise UsageError(f"--engine tvm: target {target.name} cannot load TVM libraries ({target.no_tvm_reason}); "
                         "leave --engine out (or use --engine onnxruntime)")
    return options.engines, []


def _check_options(engines: tuple[str, ...], options: DeployOptions, target: Target) -> None:
    if options.blocks_data is not None and not options.blocks:
        raise UsageError("--blocks-data goes with --blocks")
    if options.blocks_data is not None:
        from hmt.deploy.blocks import read_labelled

        # Read now, not after a minute of exporting blocks (its shape is checked there, against the space's).
        read_labelled(options.blocks_data, None, seed=options.seed, max_samples=1)
    if options.canary_data is not None:
        from hmt.deploy.adaptable import read_canary

        read_canary(options.canary_data)  # likewise, before the adaptable graphs are exported
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise UsageError(f"unknown or no engine(s) {unknown}; choose from {', '.join(ENGINES)}")
    if "onnxruntime" not in engines:
        # The ONNX graphs are the portable fallback (and what serve verifies against).
        raise UsageError("the onnxruntime engine cannot be left out: every bundle carries the ONNX graphs")
    if options.memory_mb is not None and target.memory_bytes and options.memory_mb * 1e6 > target.memory_bytes:
        raise UsageError(f"--memory-mb {options.memory_mb} exceeds {target.name}'s memory "
                         f"({target.memory_bytes / 1e6:.0f} MB)")
    if "tvm" in engines:
        target.compiler()  # a missing cross-compiler is a clear error before any work


def _add_blocks(writer: ArtifactWriter, bundled: list[BundleVariant], front: Any, options: DeployOptions,
                progress: ProgressCallback) -> list[str]:
    """``--blocks``: the fp32 variants' shared block graphs (hmt.deploy.blocks); the notes it adds."""
    from hmt.deploy.adaptable import supernet_of
    from hmt.deploy.blocks import BlocksOptions, write_blocks

    ids = [v.arch_id for v in bundled if str(v.extra.get("precision", "fp32")) == "fp32"]
    if not ids:
        raise UsageError("--blocks needs fp32 variants (the blocks are float graphs); every bundled one is quantised")
    loaded = supernet_of(front, options.supernet, what="--blocks")
    summary = write_blocks(writer, loaded, ids, BlocksOptions(data=options.blocks_data, seed=options.seed), progress)
    return list(summary["notes"])


def _config(options: DeployOptions, target: Target, engines: tuple[str, ...], variants: list[FusedVariant],
            out_dir: Path, fused_root: Path, pareto_root: Path, profile_path: Path,
            profile_bytes: bytes) -> dict[str, Any]:
    """The bundle manifest's config: what it was built from (relative to it) and how."""
    from hmt.artifacts.paths import relative_to_artifact

    return {
        "target": target.name,
        "fused": relative_to_artifact(fused_root, out_dir),
        "pareto": relative_to_artifact(pareto_root, out_dir),
        # A profile directory is an artifact (recorded relative to this one); a file, by name and sha256.
        "profile": relative_to_artifact(profile_path, out_dir) if profile_path.is_dir() else profile_path.name,
        "profile_sha256": hashlib.sha256(profile_bytes).hexdigest(),
        "variants": [v.arch_id for v in variants],
        "engines": list(engines),
        "strict": options.strict,
        "budgets": {"latency_ms": options.latency_ms, "memory_mb": options.memory_mb, "energy": options.energy},
        "adaptable": options.adaptable,
        **({"blocks": True} if options.blocks else {}),
        "toolchain": {"hmt": __version__, "tvm_target": target.tvm_target,
                      "compiler": _compiler_version(target) if "tvm" in engines else None},
    }


def _add_adaptable(writer: ArtifactWriter, bundled: list[BundleVariant], front: Any, options: DeployOptions,
                   progress: ProgressCallback, notes: list[str], classes: int) -> list[BundleVariant]:
    """deploy --adaptable: BN-adaptable graphs for serve --adapt, and the canary set it checks them on."""
    from hmt.deploy.adaptable import add_adaptable, ship_canary

    progress("adaptable", 0, len(bundled), None)
    bundled, adapt_notes = add_adaptable(writer, bundled, front, options.supernet)
    notes.extend(adapt_notes)
    notes.append("variants with extra.adaptable carry BN-adaptable graphs (variants/<arch_id>/adapt): "
                 "hmt serve --adapt re-estimates their BN statistics on recent inputs without torch")
    if options.canary_data is not None:
        shipped = ship_canary(writer, options.canary_data, seed=options.seed, num_classes=classes)
        notes.append(f"{shipped['path']}: {shipped['samples']} labelled samples (of {shipped['of']}, seed "
                     f"{shipped['seed']}) that serve --adapt checks every adapted variant against")
    else:
        notes.append("no canary set shipped (deploy --canary-data): serve --adapt will need --canary")
    progress("adaptable", len(bundled), len(bundled), None)
    return bundled


def _record_metrics(writer: ArtifactWriter, target: Target, builds: list[VariantBuild],
                    lineage: Any) -> tuple[int, float, dict[str, str]]:
    """The manifest's metrics; returns (bundle size in bytes, compile seconds, TVM failures by arch id)."""
    size_bytes = sum(p.stat().st_size for p in writer.tmp_dir.rglob("*") if p.is_file())
    compile_s = sum(b.compile_s for b in builds)
    failures = {b.arch_id: b.tvm_error for b in builds if b.tvm_error}
    writer.metrics.update({
        "target": target.name, "variants": len(builds), "size_bytes": size_bytes,
        "compile_s": round(compile_s, 3), "tvm_failures": failures, "lineage": lineage,
        "per_variant": {b.arch_id: {"engines": list(b.engines), "size_bytes": b.size_bytes,
                                    "compile_s": round(b.compile_s, 3)} for b in builds},
    })
    return size_bytes, compile_s, failures


def _check_outputs(out_dir: Path | str, options: DeployOptions, inputs: list[Any],
                   force: bool) -> tuple[Path, Path | None]:
    """Refuse, before any work, an output that is not deploy's to replace; returns (the bundle's absolute
    path, its archive or None)."""
    from hmt.artifacts.outputs import check_output_dir, check_output_file

    check_output_dir(out_dir, kind=BUNDLE_KIND, inputs=inputs, force=force)
    out_abs = Path(os.path.abspath(out_dir))
    archive = archive_path_for(out_abs) if options.archive else None
    if archive is not None:
        check_output_file(archive, recognise=is_bundle_archive, description="an hmt bundle archive", inputs=inputs,
                          what="--out (its archive)")
    return out_abs, archive


def _build_variants(writer: ArtifactWriter, variants: list[FusedVariant], points: Mapping[str, Mapping[str, Any]],
                    *, fused: Any, target: Target, engines: tuple[str, ...], options: DeployOptions,
                    progress: ProgressCallback, threads: int | None, notes: list[str]
                    ) -> tuple[list[BundleVariant], list[VariantBuild]]:
    """Every variant's graphs exported and compiled into the bundle; a failed TVM build is noted in ``notes``."""
    total = sum(len(v.graphs()) for v in variants)
    done = [0]
    sessions = _ort_sessions(fused)
    bundled: list[BundleVariant] = []
    builds: list[VariantBuild] = []
    for variant in variants:
        bundle_variant, build = _build_variant(
            writer, variant, points[variant.arch_id], fused=fused, target=target, engines=engines,
            strict=options.strict, progress=progress, done=done, total=total,
            ort_session=sessions.get(variant.name), threads=threads)
        bundled.append(bundle_variant)
        builds.append(build)
        if build.tvm_error:
            notes.append(f"variant {build.arch_id}: TVM build for {target.name} failed ({build.tvm_error}); "
                         "bundled for ONNX Runtime only")
    progress("compile", total, total, None)
    return bundled, builds


def _sign_and_archive(writer: ArtifactWriter, signing_key: Any, archive: Path | None, out_abs: Path,
                      options: DeployOptions) -> None:
    """Sign the bundle before it is committed, and write its archive beside it, where asked."""
    if signing_key is not None:
        writer.before_commit(partial(sign_artifact_dir, private_key=signing_key, version=options.version))
    if archive is not None:
        writer.companion(archive, partial(build_archive_file, root_name=out_abs.name),
                         recognise=is_bundle_archive, description="an hmt bundle archive")


def _write_spec_files(writer: ArtifactWriter, spec: BundleSpec, profile_bytes: bytes, index: dict[str, Any],
                      serve: dict[str, Any]) -> None:
    """bundle.json (checked to parse as serve will read it), the profile, the front's index and serve.json."""
    writer.write_json(BUNDLE_SPEC_NAME, spec.to_json_dict())
    writer.write_bytes(PROFILE_NAME, profile_bytes)
    writer.write_json(INDEX_NAME, index)
    writer.write_json(SERVE_CONFIG_NAME, serve)
    BundleSpec.from_mapping(spec.to_json_dict())  # what serve will read must parse


def deploy_bundle(
    fused_dir: Path | str,
    pareto_dir: Path | str,
    out_dir: Path | str,
    *,
    options: DeployOptions,
    progress: ProgressCallback = no_progress,
    force: bool = False,
) -> DeployResult:
    """Build the bundle for ``options.target`` in ``out_dir`` (atomically) and ``<out>.tar.gz``.

    ``out_dir`` and the archive are checked before any work (:mod:`hmt.artifacts.outputs`)."""
    from hmt.pareto.artifact import load_front
    from hmt.pareto.index import FrontIndex
    from hmt.runtime.settings import Budgets, ServeSettings

    start = time.perf_counter()
    target = get_target(options.target)
    engines, engine_notes = resolve_engines(options, target)
    _check_options(engines, options, target)
    inputs = [p for p in (fused_dir, pareto_dir, options.profile, options.sign_key, options.supernet,
                        options.blocks_data) if p]
    out_abs, archive = _check_outputs(out_dir, options, inputs, force)
    signing_key = load_private_key(options.sign_key) if options.sign_key is not None else None
    serve = ServeSettings(budgets=Budgets(latency_ms=options.latency_ms, memory_mb=options.memory_mb,
                                          energy=options.energy))
    fused = load_artifact(fused_dir, kind=FUSED_KIND)
    front = load_front(pareto_dir)
    variants, points, slower_notes, lineage = selected_variants(fused, front, options.variants, options.energy)
    profile_path = Path(options.profile) if options.profile is not None else default_profile_path(target)
    profile_bytes, profile_doc, profile_artifact = read_profile(profile_path)
    profile_id = str(profile_doc["device"]["id"])
    pareto_profile = (front.doc.get("profile") or {}).get("id")
    first, classes = one_input_and_classes(variants)
    config = _config(options, target, engines, variants, Path(out_dir), fused.root, front.artifact.root,
                     profile_path, profile_bytes)
    parents = [fused, front.artifact, *([profile_artifact] if profile_artifact is not None else [])]
    threads, threads_note = profile_threads(profile_doc)
    notes = [*target_notes(target, engines, pareto_profile, profile_id), *engine_notes, *slower_notes, *threads_note,
             *budget_notes({v.arch_id: points[v.arch_id] for v in variants}, options.latency_ms, options.memory_mb)]
    preprocess, class_names, meta_note = checked_input_meta(front, options.allow_missing_preprocess)
    with ArtifactWriter(out_dir, kind=BUNDLE_KIND, config=config, parents=parents, inputs=inputs,
                        force=force) as writer:
        _sign_and_archive(writer, signing_key, archive, out_abs, options)
        bundled, builds = _build_variants(writer, variants, points, fused=fused, target=target, engines=engines,
                                          options=options, progress=progress, threads=threads, notes=notes)
        notes.extend(quantised_notes(bundled))
        if options.adaptable:
            bundled = _add_adaptable(writer, bundled, front, options, progress, notes, classes)
        if options.blocks:
            notes.extend(_add_blocks(writer, bundled, front, options, progress))
        if meta_note is not None:
            notes.append(meta_note)
        if class_names is not None and len(class_names) != int(classes):
            notes.append(f"the supernet's {len(class_names)} class names do not match the {classes} outputs: dropped")
            class_names = None
        spec = BundleSpec(target=target.to_json_dict(), input=first.input, classes=int(classes),
                          variants=tuple(bundled), notes=tuple(notes), preprocess=preprocess,
                          class_names=class_names)
        keep = {v.arch_id for v in variants}
        index = FrontIndex([e for e in front.index.entries if e.arch_id in keep], units=front.index.units,
                           meta={**front.index.meta, "bundle_target": target.name, "bundle_profile": profile_id})
        _write_spec_files(writer, spec, profile_bytes, index.to_json_dict(), serve.to_json_dict())
        size_bytes, compile_s, failures = _record_metrics(writer, target, builds, lineage)
    return DeployResult(
        out_dir=Path(out_dir), archive=archive, target=target, variants=tuple(builds), notes=tuple(notes),
        lineage=lineage, size_bytes=size_bytes,
        archive_size_bytes=writer.companion_bytes.get(Path(os.path.abspath(archive))) if archive else None,
        compile_s=compile_s, build_s=time.perf_counter() - start, profile_id=profile_id, failures=failures,
    )
