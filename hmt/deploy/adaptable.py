"""``deploy --adaptable``: put BN-adaptable graphs beside each variant's fused chain.

The fused graphs a bundle serves have their batch norms folded into the convolutions, so
the device cannot re-estimate BN statistics from them. With ``--adaptable`` deploy
materialises each fp32 variant from the supernet the pareto front names and writes, under
``variants/<arch_id>/adapt/``, what :mod:`hmt.adapt.bn_export` makes: ``bn.json`` (each
BN layer's byte offsets, affine parameters, shipped statistics, and the drift reference:
input statistics of the supernet's calibration set) and, per graph of the chain,
``<graph>.stats.onnx`` (batch statistics as outputs) and ``<graph>.infer.onnx`` (BN as a
patchable scale/shift). They are files of the bundle like any other: listed with their
sha256 in its manifest, recorded in ``bundle.json`` (``extra.adaptable`` of the variant),
and checked by ``deploy --verify`` (the inference graphs with the shipped statistics must
answer as the fused chain does). ``hmt serve --adapt`` re-estimates from them without torch.

Quantised variants (int8/fp16) are not made adaptable: their graphs are not the float
network the statistics belong to; the bundle says so in its notes.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from hmt.artifacts import ArtifactWriter
from hmt.errors import NPZ_ERRORS, HmtError, ModelError, UsageError

ADAPT_DIR = "adapt"
ADAPT_METHOD = "bn-reestimation"
# The inference graphs keep BN as Mul/Add that ORT folds at load time; the fused chain had it
# folded by the exporter. The two differ by float rounding only (measured ~1e-5 on logits).
ATOL = 1e-3


def adapt_folder(variant_folder: str) -> str:
    return f"{variant_folder}/{ADAPT_DIR}"


def supernet_of(front: Any, override: Path | None, *, what: str = "--adaptable") -> Any:
    """The loaded supernet the front's variants come from: ``--supernet``, or the one the front
    was searched on (recorded relative to the front, found by its manifest sha256); ``what`` is the
    option that needs it (named in the refusals)."""
    from hmt.artifacts.lineage import find_parent
    from hmt.supernet import load_supernet

    if override is not None:
        return load_supernet(override)
    record = next((p for p in front.artifact.manifest.parents if p.kind == "supernet"), None)
    if record is None:
        raise UsageError(f"{what} needs the supernet the variants come from: the pareto front records none; "
                         "pass --supernet PATH")
    found = find_parent(front.artifact, record, verify_checksums=False)
    if found is None:
        raise UsageError(f"{what}: the supernet the front was searched on ({record.path}, relative to "
                         f"{front.artifact.root}) is gone or was rebuilt after the search; pass --supernet PATH")
    return load_supernet(found.root)


def write_adaptable(writer: ArtifactWriter, folder: str, model: Any, example: Any, calibration: Any,
                    *, expected_segments: int) -> dict[str, Any]:
    """Export ``model`` (an eval-mode torch variant with ``segments`` and ``exit_heads``) into
    ``folder/adapt`` of the artifact being written; returns the ``extra.adaptable`` record."""
    from hmt.adapt.bn_export import BN_SPEC_NAME, export_bn_adaptable

    segments = getattr(model, "segments", None)
    if segments is None or len(segments) != expected_segments:
        raise ModelError(f"{folder}: the materialised variant has {0 if segments is None else len(segments)} "
                         f"segments, the fused chain {expected_segments}; cannot make it adaptable")
    target = adapt_folder(folder)
    with tempfile.TemporaryDirectory(prefix="hmt-adaptable-") as tmp:
        spec = export_bn_adaptable(model, example, Path(tmp) / "bn", source_inputs=calibration)
        files = [BN_SPEC_NAME, *[g[k] for g in spec["graphs"] for k in ("stats", "infer")]]
        for name in files:
            shutil.copyfile(Path(tmp) / "bn" / name, writer.path(f"{target}/{name}"))
    size_bytes = sum(writer.path(f"{target}/{name}").stat().st_size for name in files)
    return {"dir": target, "method": ADAPT_METHOD, "bn_layers": sum(len(g["layers"]) for g in spec["graphs"]),
            "graphs": len(spec["graphs"]), "size_bytes": size_bytes,
            "drift_reference": "drift_reference" in spec}


def add_adaptable(writer: ArtifactWriter, bundled: list[Any], front: Any,
                  supernet: Path | None) -> tuple[list[Any], list[str]]:
    """Adaptable graphs for every fp32 variant of ``bundled`` (BundleVariant); the variants with
    ``extra.adaptable`` set, and notes for those left out."""
    import dataclasses

    import torch

    from hmt.bundle import variant_dir

    loaded = supernet_of(front, supernet)
    calibration = torch.cat(loaded.calibration_batches())
    example = calibration[:2]
    out, notes = [], []
    for variant in bundled:
        precision = str(variant.extra.get("precision", "fp32"))
        if precision != "fp32":
            notes.append(f"variant {variant.arch_id}: {precision}, not made adaptable (BN re-estimation needs "
                         "the float graphs)")
            out.append(variant)
            continue
        try:
            model = loaded.materialize(loaded.space.parse(variant.arch_id)).eval()
        except HmtError as exc:
            raise ModelError(f"--adaptable: variant {variant.arch_id} is not a variant of supernet "
                             f"{loaded.artifact.root}: {exc}") from exc
        record = write_adaptable(writer, variant_dir(variant.arch_id), model, example, calibration,
                                 expected_segments=len(variant.segments))
        out.append(dataclasses.replace(variant, extra={**variant.extra, "adaptable": record}))
    return out, notes


def check_adaptable(bundle: Any, variant: Any, x: np.ndarray, reference: list[np.ndarray]) -> tuple[bool, str]:
    """The adaptable graphs with the shipped statistics against the fused chain's exit logits
    ``reference`` on the same input: (ok, detail). Torch-free (numpy and ONNX Runtime)."""
    from hmt.adapt.bn_runtime import BnReestimator, bn_source_in

    record = variant.extra.get("adaptable")
    source = bn_source_in(bundle.artifact, str(record["dir"]))
    chain = BnReestimator(source).shipped()
    logits = chain.run(x)
    if len(logits) != len(reference):
        return False, f"{len(logits)} exits in the adaptable graphs, {len(reference)} in the fused chain"
    errors = [float(np.max(np.abs(a - b))) for a, b in zip(logits, reference, strict=True)]
    ok = all(np.allclose(a, b, atol=ATOL, rtol=ATOL) for a, b in zip(logits, reference, strict=True))
    return ok, (f"{source.where}: max |adaptable - fused| {max(errors):.2e} over {len(errors)} exit(s) "
                f"(atol {ATOL}); {sum(len(g.layers) for g in source.graphs)} BN layers")


def adaptable_record(variant: Any) -> dict[str, Any] | None:
    record = variant.extra.get("adaptable")
    return record if isinstance(record, dict) and isinstance(record.get("dir"), str) else None



CANARY_NAME = "canary.npz"  # under ADAPT_DIR at the bundle's top: what serve --adapt checks adoptions against
CANARY_MAX_SAMPLES = 256


def ship_canary(writer: ArtifactWriter, source: Path, *, seed: int, max_samples: int = CANARY_MAX_SAMPLES,
                num_classes: int | None = None) -> dict[str, Any]:
    """Copy a seeded subset of the labelled set ``source`` (an .npz with ``x`` and ``y``) into the
    bundle as ``adapt/canary.npz``: the held-out set ``serve --adapt`` checks every adapted variant
    against by default (clients cannot steer it). Returns what was shipped."""
    x, y = read_canary(source, num_classes)
    keep = np.sort(np.random.default_rng(seed).permutation(len(y))[:max_samples])
    target = f"{ADAPT_DIR}/{CANARY_NAME}"
    writer.path(target).parent.mkdir(parents=True, exist_ok=True)
    with open(writer.path(target), "wb") as handle:
        np.savez(handle, x=x[keep], y=y[keep].astype(np.int64))
    return {"path": target, "samples": len(keep), "of": len(y), "seed": seed}


def read_canary(source: Path, num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of the labelled set ``source``, refused (UsageError) unless x is uint8 pixels or finite
    floats and y one class index each (below ``num_classes``; None: only >= 0, deploy's read before
    any work, when the classes are not known yet)."""
    try:
        with np.load(source, allow_pickle=False) as archive:
            x, y = np.asarray(archive["x"]), np.asarray(archive["y"])
    except NPZ_ERRORS as exc:
        raise UsageError(f"--canary-data {source}: expected an .npz with x (inputs or uint8 pixels) and y "
                         f"(labels) ({exc})") from exc
    if y.ndim != 1 or len(y) != len(x) or not len(y) or not np.issubdtype(y.dtype, np.integer):
        raise UsageError(f"--canary-data {source}: y must be a non-empty vector of {len(x)} integer labels, got "
                         f"{y.dtype} {list(y.shape)}")
    if x.dtype != np.uint8 and not (np.issubdtype(x.dtype, np.floating) and np.all(np.isfinite(x))):
        raise UsageError(f"--canary-data {source}: x must be uint8 pixels or finite floats, got {x.dtype}")
    if y.min() < 0 or (num_classes is not None and y.max() >= num_classes):
        # Shipped as given, such labels made serve --adapt refuse the bundle at start, on the device.
        classes = "0 or more" if num_classes is None else f"0..{num_classes - 1}"
        raise UsageError(f"--canary-data {source}: y must be class indices {classes}, got {int(y.min())}.."
                         f"{int(y.max())}")
    return x, y
