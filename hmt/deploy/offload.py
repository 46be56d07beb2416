"""Offload bundles: a deploy bundle split into the device's half (heads) and the peer's (tails).

For every variant of the bundle the cuts are, in chain order: the input; inside each
segment, every single-tensor cut whose tensor is smaller than anything before it
(:mod:`hmt.convert.partition`); and each stage boundary before the variant's exit (its
exit points). Each inner cut's head and tail graphs are exported and verified against the
whole segment (head then tail within 1e-5 in fp32) before anything is written.

Both outputs are ordinary bundles (``hmt serve`` verifies them the same way) with the
same ``bundle.json`` plus ``offload.json`` (:mod:`hmt.offload.plan`). The device bundle
keeps every segment and adds the inner heads *and* tails, because the device must be
able to finish any request alone when the peer is gone; the peer bundle adds only the
tails. Both carry the source's TVM libraries, compiled for the device's target: a peer of
the same machine runs them where fuse chose TVM, any other peer runs ONNX Runtime
(:func:`hmt.offload.parts.chain_engine`); compiling the tails for a different peer target
is not done here.

Signing: the halves are new artifacts (new files, a new manifest), so the source's
signature cannot cover them; given the signing key, each half gets its own ``manifest.sig``
bound to the source's release (its version and creation time), so ``serve --trusted-key``
accepts either half and orders it with the source for roll-back.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hmt.artifacts import ArtifactWriter
from hmt.bundle import BUNDLE_KIND, Bundle, BundleVariant, TensorSpec, load_bundle, variant_dir
from hmt.offload.plan import OFFLOAD_PLAN_NAME, Cut, OffloadPlan
from hmt.progress import ProgressCallback, no_progress


@dataclass(frozen=True)
class OffloadBundles:
    device: Path
    peer: Path
    plan: OffloadPlan
    cuts: int
    inner_cuts: int
    max_rel_error: float


def _safe_name(tensor: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in tensor)[:64]


def _variant_cuts(bundle: Bundle, variant: BundleVariant, *, seed: int, max_inner_per_segment: int
                  ) -> tuple[list[Cut], dict[str, bytes], dict[str, bytes]]:
    from hmt.convert.graph import load_onnx
    from hmt.convert.partition import find_inner_cuts, smaller_than_before, split_model, verify_split

    cuts: list[Cut] = [Cut(0, "input", 0, variant.segments[0].input)]
    heads: dict[str, bytes] = {}
    tails: dict[str, bytes] = {}
    smallest = cuts[0].numel
    for k in range(variant.exit_stage + 1):
        segment = variant.segments[k]
        model = load_onnx(bundle.path(segment.onnx))
        inner = smaller_than_before(find_inner_cuts(model), smallest)[:max_inner_per_segment]
        for found in inner:
            head, tail = split_model(model, found.tensor)
            error = verify_split(model, head, tail, seed=seed + k)
            stem = f"{variant_dir(variant.arch_id)}/cuts/segment_{k}.{_safe_name(found.tensor)}"
            heads[f"{stem}.head.onnx"] = head.SerializeToString()
            tails[f"{stem}.tail.onnx"] = tail.SerializeToString()
            cuts.append(Cut(len(cuts), "inner", k, TensorSpec(found.tensor, found.shape, found.dtype),
                            head=f"{stem}.head.onnx", tail=f"{stem}.tail.onnx", max_rel_error=error))
            smallest = min(smallest, found.numel)
        if k < variant.exit_stage:
            cuts.append(Cut(len(cuts), "boundary", k + 1, segment.output))
            smallest = min(smallest, cuts[-1].numel)
    return cuts, heads, tails


def _copy_bundle(writer: ArtifactWriter, bundle: Bundle) -> None:
    for record in bundle.artifact.manifest.files:
        shutil.copyfile(bundle.path(record.path), writer.path(record.path))


def _signer(writer: ArtifactWriter, bundle: Bundle, sign_key: Path | str | None) -> None:
    """Sign the half being written as the same release as its source (its version and creation time,
    when the source is signed): ``serve --trusted-key`` then takes both halves, and orders them with
    the whole bundle for roll-back."""
    if sign_key is None:
        return
    from hmt.artifacts.signing import load_private_key, read_release, sign_artifact_dir

    key = load_private_key(sign_key)
    release = read_release(bundle.root)
    version, created = release if release is not None else (0, None)
    writer.before_commit(partial(sign_artifact_dir, private_key=key, version=version, created_utc=created))


def write_offload_bundles(bundle_path: Path | str, device_out: Path | str, peer_out: Path | str, *,
                          seed: int = 0, max_inner_per_segment: int = 2, sign_key: Path | str | None = None,
                          progress: ProgressCallback = no_progress, force: bool = False) -> OffloadBundles:
    """Split ``bundle_path`` into a device bundle and a peer bundle (see the module docstring).

    Both outputs are checked before any work: each is new, empty, or a bundle (any artifact
    with ``force``) holding only what its manifest lists; neither may be or hold the source.
    ``sign_key`` (ed25519 PEM): sign both halves (``manifest.sig``) as the source's release."""
    from hmt.artifacts.outputs import check_output_dir

    for out in (device_out, peer_out):
        check_output_dir(out, kind=BUNDLE_KIND, inputs=[bundle_path], force=force, what="--offload-out")
    bundle = load_bundle(bundle_path)
    plan_cuts: dict[str, tuple[Cut, ...]] = {}
    heads: dict[str, bytes] = {}
    tails: dict[str, bytes] = {}
    for i, variant in enumerate(bundle.spec.variants):
        progress("partition variants", i, len(bundle.spec.variants), variant.arch_id)
        cuts, h, t = _variant_cuts(bundle, variant, seed=seed, max_inner_per_segment=max_inner_per_segment)
        plan_cuts[variant.arch_id] = tuple(cuts)
        heads.update(h)
        tails.update(t)
    plan = OffloadPlan(plan_cuts)
    all_cuts = [c for cuts in plan_cuts.values() for c in cuts]
    worst = max((c.max_rel_error for c in all_cuts), default=0.0)
    metrics: dict[str, Any] = {"cuts": len(all_cuts), "inner_cuts": sum(c.kind == "inner" for c in all_cuts),
                               "max_rel_error": worst}
    # The source's config too: serve checks the manifest's target against bundle.json's (a split
    # without it was refused: "target 'x86-64', but manifest.json says None").
    config = dict(bundle.artifact.manifest.config) | {"offload": True, "seed": seed,
                                                      "max_inner_per_segment": max_inner_per_segment}
    for out, role, parts in ((device_out, "device", heads | tails), (peer_out, "peer", tails)):
        with ArtifactWriter(out, kind=BUNDLE_KIND, config=config | {"role": role},
                            parents=[bundle.artifact], force=force, what="--offload-out") as writer:
            _signer(writer, bundle, sign_key)
            _copy_bundle(writer, bundle)
            for name, data in parts.items():
                writer.write_bytes(name, data)
            writer.write_json(OFFLOAD_PLAN_NAME, plan.to_json_dict())
            writer.metrics.update(metrics | {"role": role})
    progress("partition variants", len(bundle.spec.variants), len(bundle.spec.variants), "done")
    return OffloadBundles(Path(device_out), Path(peer_out), plan, metrics["cuts"], metrics["inner_cuts"], worst)
