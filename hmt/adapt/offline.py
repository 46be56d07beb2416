"""``hmt adapt``: adapt a model to the sets of a data directory, offline, and keep the result.

The model is a supernet artifact (a variant of it is materialised; BN re-estimation or
TENT in torch) or a ``bn-adaptable`` artifact (BN re-estimation in the torch-free
runtime, as a device without torch runs it). The data is a shift set
(``scripts/make_corruptions.py``) or any CIFAR-10 source hmt reads (its test split).
The output is an artifact of kind ``adapted``: ``report.json`` (per set: accuracy and
entropy before/after, time per batch, the guard's decision) and, for each set whose
adapted variant the guard accepted, ``variants/<set>.safetensors`` with that variant's
BN tensors (affine parameters and running statistics), which ``load_state_dict`` on the
materialised variant (strict=False) turns into the adapted model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.adapt.guard import GuardPolicy, accuracy, decide, entropy_np
from hmt.errors import InputError, UsageError
from hmt.progress import ProgressCallback, no_progress

ADAPTED_KIND = "adapted"
REPORT_NAME = "report.json"


@dataclass(frozen=True)
class DataSets:
    sets: dict[str, np.ndarray]  # uint8 images per set name
    labels: np.ndarray
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str


def load_sets(path: Path, *, names: Sequence[str] | None, limit: int | None) -> DataSets:
    """A shift set, or a CIFAR-10 source's test split (one set named ``test``)."""
    from hmt.adapt.corruptions import SHIFT_SET_KIND, load_shift_set
    from hmt.adapt.run import balanced_split
    from hmt.data.cifar import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD

    if not path.exists():
        raise InputError(f"{path}: does not exist; expected a data directory")
    if (path / "manifest.json").is_file():
        from hmt.artifacts import load_artifact

        kind = load_artifact(path, kind=(SHIFT_SET_KIND, "supernet", "bundle", "bn-adaptable"),
                             verify_checksums=False).kind
        if kind != SHIFT_SET_KIND:
            raise InputError(f"{path}: is a {kind} artifact; --data expects a shift set or a CIFAR-10 source")
        shift = load_shift_set(path, names=names)
        sets, labels, source = shift.sets, shift.labels, path.name  # by name: no path of this machine
        if labels.max() >= len(CIFAR10_CLASSES):  # its images are normalised as CIFAR-10's: its labels are too
            raise InputError(f"{path}: label {int(labels.max())} is not a CIFAR-10 class "
                             f"(0..{len(CIFAR10_CLASSES) - 1})")
    else:
        from hmt.data import load_dataset

        if names and list(names) != ["test"]:
            raise UsageError(f"{path}: a CIFAR-10 source has one set, 'test'; got --set {', '.join(names)}")
        data = load_dataset("cifar10", path)
        sets, labels, source = {"test": data.test_x}, data.test_y, Path(data.info.source).name or data.info.source
    if limit is not None:
        keep = balanced_split(labels, limit)[0]
        sets = {k: v[keep] for k, v in sets.items()}
        labels = labels[keep]
    return DataSets(sets, labels, CIFAR10_MEAN, CIFAR10_STD, source)


def _normalize_np(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return np.asarray((x.astype(np.float32) / 255.0 - np.asarray(mean, np.float32).reshape(shape))
                      / np.asarray(std, np.float32).reshape(shape), dtype=np.float32)


def adapt_runtime(bn_path: Any, data: DataSets, *, batch_size: int, guard: GuardPolicy, seed: int = 0,
                  progress: ProgressCallback = no_progress) -> list[dict[str, Any]]:
    """BN re-estimation in the torch-free runtime, per set (no variant files: the
    statistics are re-estimated on the device)."""
    import time

    from hmt.adapt.bn_runtime import BnReestimator

    runtime = BnReestimator(bn_path)
    expected = runtime.spec.get("input_shape")
    rows = []
    for k, (name, images) in enumerate(data.sets.items()):
        if expected is not None and list(images.shape[1:]) != list(expected):
            raise InputError(f"set {name!r}: images {list(images.shape[1:])}, but the graphs take {list(expected)} "
                             "(C, H, W)")
        x = _normalize_np(images, data.mean, data.std)
        runtime.reset()
        order = np.random.default_rng(seed).permutation(len(x))  # sets are sorted by class (AdaptOptions.seed)
        x, labels = x[order], data.labels[order]
        before = np.concatenate([runtime.shipped().run(x[i:i + 500])[-1] for i in range(0, len(x), 500)])
        start = time.perf_counter()
        stream = [x[i:i + batch_size] for i in range(0, len(x), batch_size) if len(x[i:i + batch_size]) >= 2]
        for b in stream:
            runtime.observe(b)
        adapted = runtime.adapted()
        ms = (time.perf_counter() - start) * 1e3 / len(stream)
        after = np.concatenate([adapted.run(x[i:i + 500])[-1] for i in range(0, len(x), 500)])
        decision = decide(recent_logits_before=before, recent_logits_after=after, policy=guard)
        rows.append({"name": name, "images": len(x), "accuracy_before": accuracy(before, labels),
                     "accuracy_after": accuracy(after, labels), "accuracy_online": None,
                     "entropy_before": float(entropy_np(before).mean()),
                     "entropy_after": float(entropy_np(after).mean()), "adapt_ms_per_batch": ms,
                     "accepted": decision.accepted, "reason": decision.reason,
                     "canary_accuracy_before": None, "canary_accuracy_after": None})
        progress("adapt", k + 1, len(data.sets), name)
    return rows


def run_adapt(model_path: Path, data_path: Path, out: Path, *, arch: str | None, method: str,
              names: Sequence[str] | None, limit: int | None, options: Any,
              progress: ProgressCallback = no_progress, force: bool = False) -> dict[str, Any]:
    """Adapt and write the ``adapted`` artifact; returns its report."""
    from hmt.artifacts import ArtifactWriter, load_artifact
    from hmt.artifacts.outputs import check_output_dir
    from hmt.artifacts.paths import relative_to_artifact

    check_output_dir(out, kind=ADAPTED_KIND, inputs=[model_path, data_path], force=force)
    kind = load_artifact(model_path, kind=("supernet", "bn-adaptable", "bundle"), verify_checksums=False).kind
    data = load_sets(data_path, names=names, limit=limit)
    if kind == "bundle":
        return _run_bundle(model_path, data, out, arch=arch, method=method, limit=limit, options=options,
                           progress=progress, force=force)
    config = {"model": relative_to_artifact(model_path, out), "data": data.source, "arch": arch, "method": method,
              "limit": limit, "sets": list(data.sets), "batch_size": options.batch_size}
    if kind == "bn-adaptable":
        if method != "bn":
            raise UsageError(f"{model_path}: a bn-adaptable graph adapts by BN re-estimation only (--method bn)")
        parent = load_artifact(model_path, kind="bn-adaptable")
        rows = adapt_runtime(model_path, data, batch_size=options.batch_size, guard=options.guard,
                             seed=options.seed, progress=progress)
        report = {"config": config, "sets": rows}
        with ArtifactWriter(out, kind=ADAPTED_KIND, config=config, parents=[parent], force=force) as writer:
            writer.write_json(REPORT_NAME, report)
            writer.metrics.update(_headline(rows))
        return report
    return _run_torch(model_path, data, out, arch=arch, config=config, options=options, progress=progress,
                      force=force)


def _run_bundle(path: Path, data: DataSets, out: Path, *, arch: str | None, method: str, limit: int | None,
                options: Any, progress: ProgressCallback, force: bool) -> dict[str, Any]:
    """BN re-estimation on a bundle's adaptable graphs (``hmt deploy --adaptable``), as serve --adapt runs it."""
    from hmt.adapt.bn_runtime import bn_source_in
    from hmt.artifacts import ArtifactWriter
    from hmt.bundle import load_bundle

    bundle = load_bundle(path)
    adaptable = [v for v in bundle.spec.variants if isinstance(v.extra.get("adaptable"), dict)]
    if not adaptable:
        raise UsageError(f"{path}: this bundle carries no BN-adaptable graphs; build it with "
                         "`hmt deploy ... --adaptable`")
    if method != "bn":
        raise UsageError(f"{path}: a bundle adapts by BN re-estimation only (--method bn)")
    if arch in (None, "largest"):
        variant = max(adaptable, key=lambda v: v.accuracy)
    elif arch == "smallest":
        variant = min(adaptable, key=lambda v: v.latency_ms)
    else:
        variant = bundle.spec.variant(arch)
        if variant not in adaptable:
            raise UsageError(f"{path}: variant {arch} has no BN-adaptable graphs; adaptable: "
                             f"{', '.join(v.arch_id for v in adaptable)}")
    source = bn_source_in(bundle.artifact, str(variant.extra["adaptable"]["dir"]))
    rows = adapt_runtime(source, data, batch_size=options.batch_size, guard=options.guard, seed=options.seed,
                         progress=progress)
    from hmt.artifacts.paths import relative_to_artifact

    config = {"model": relative_to_artifact(path, out), "data": data.source, "arch": variant.arch_id,
              "method": method, "limit": limit, "sets": list(data.sets), "batch_size": options.batch_size}
    report = {"config": config, "sets": rows}
    with ArtifactWriter(out, kind=ADAPTED_KIND, config=config, parents=[bundle.artifact], force=force) as writer:
        writer.write_json(REPORT_NAME, report)
        writer.metrics.update(_headline(rows))
    return report


def _headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {r["name"]: {"accuracy_before": r["accuracy_before"], "accuracy_after": r["accuracy_after"],
                        "accepted": r["accepted"]} for r in rows}


def _run_torch(model_path: Path, data: DataSets, out: Path, *, arch: str | None, config: dict[str, Any],
               options: Any, progress: ProgressCallback, force: bool) -> dict[str, Any]:
    from safetensors.torch import save_file

    from hmt.adapt.run import adapt_sets, normalize
    from hmt.adapt.tent import batch_norms
    from hmt.artifacts import ArtifactWriter
    from hmt.supernet import load_supernet

    loaded = load_supernet(model_path)
    arch_config = loaded.space.resolve(arch or "largest")
    model = loaded.materialize(arch_config)
    config["arch"] = arch_config.arch_id
    info = loaded.dataset_info
    sets = {name: (normalize(x, info["mean"], info["std"]), data.labels) for name, x in data.sets.items()}
    results, variants = adapt_sets(model, sets, options, progress=progress)
    rows = [r.to_json_dict() for r in results]
    report = {"config": config, "sets": rows}
    with ArtifactWriter(out, kind=ADAPTED_KIND, config=config, parents=[loaded.artifact], force=force) as writer:
        writer.write_json(REPORT_NAME, report)
        for name, variant in variants.items():
            names = {id(m) for m in batch_norms(variant)}
            tensors = {k: v.detach().contiguous() for k, v in variant.state_dict().items()
                       if _owner(variant, k) in names}
            save_file(tensors, str(writer.path(f"variants/{name}.safetensors")))
        writer.metrics.update(_headline(rows))
    return report


def _owner(model: Any, key: str) -> int:
    module = model.get_submodule(key.rsplit(".", 1)[0]) if "." in key else model
    return id(module)


def export_bn(model_path: Path, out: Path, *, arch: str | None, force: bool = False) -> dict[str, Any]:
    """Export a supernet variant as a ``bn-adaptable`` artifact for the torch-free runtime."""
    import torch

    from hmt.adapt.bn_export import BN_ADAPTABLE_KIND, export_bn_adaptable
    from hmt.artifacts.outputs import check_output_dir
    from hmt.artifacts.paths import relative_to_artifact
    from hmt.supernet import load_supernet

    check_output_dir(out, kind=BN_ADAPTABLE_KIND, inputs=[model_path], force=force, what="--export-bn")
    loaded = load_supernet(model_path)
    arch_config = loaded.space.resolve(arch or "largest")
    model = loaded.materialize(arch_config)
    example = torch.zeros(2, *tuple(loaded.model_info["input_shape"]))
    calibration = torch.cat(loaded.calibration_batches())
    return export_bn_adaptable(model, example, out, parents=(loaded.artifact,),
                               config={"supernet": relative_to_artifact(model_path, out), "arch": arch_config.arch_id},
                               source_inputs=calibration, force=force, what="--export-bn")
