"""Where a variant can be cut, as the device and the peer read it (no torch, no onnx).

A cut splits a variant's chain (``hmt.bundle``: segments ``0..s`` and one exit head per
segment) in two: the device runs the first ``device_segments`` whole segments (and,
for an ``inner`` cut, the ``head`` graph of the next one), sends one tensor, and the
peer runs the rest (the ``tail`` graph, then the remaining whole segments) up to the
variant's exit. Kinds, in chain order:

- ``input``: the device sends the input itself and runs nothing;
- ``inner``: inside segment ``device_segments``, at a tensor smaller than everything
  before it (found and verified offline by :mod:`hmt.convert.partition`);
- ``boundary``: after segment ``device_segments - 1``, i.e. at an exit point: the
  device may answer from that exit before sending anything.

A peer bundle holds the tails only; a device bundle the heads too (``has_head``).
``offload.json`` in a bundle (written by ``hmt deploy --offload``) lists every variant's
cuts with their tensor and its size in each codec; a bundle without one still offloads
at its stage boundaries (:func:`boundary_plan`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hmt.bundle import Bundle, BundleVariant, TensorSpec
from hmt.errors import ArtifactError
from hmt.offload.codec import CODECS, wire_bytes

OFFLOAD_PLAN_NAME = "offload.json"
OFFLOAD_PLAN_VERSION = 1
CUT_KINDS = ("input", "inner", "boundary")


@dataclass(frozen=True)
class Cut:
    """One cut of one variant (see the module docstring)."""

    index: int  # position in the variant's cut list (chain order); what the device asks the peer for
    kind: str
    device_segments: int
    tensor: TensorSpec
    head: str | None = None  # inner cuts: graph files relative to the bundle
    tail: str | None = None
    max_rel_error: float = 0.0  # offline head-then-tail vs whole (0 for boundary and input cuts)

    @property
    def numel(self) -> int:
        return math.prod(self.tensor.shape)

    def size_bytes(self, codec: str) -> int:
        return wire_bytes(self.numel, codec)

    @property
    def peer_first_segment(self) -> int:
        """The first segment whose output the peer holds after its first graph."""
        return self.device_segments

    def to_json_dict(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "device_segments": self.device_segments,
                "tensor": {"name": self.tensor.name, "shape": list(self.tensor.shape), "dtype": self.tensor.dtype},
                "bytes": {codec: self.size_bytes(codec) for codec in CODECS},
                "head": self.head, "tail": self.tail, "max_rel_error": self.max_rel_error}

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> Cut:
        try:
            cut = cls(index=int(data["index"]), kind=str(data["kind"]),
                      device_segments=int(data["device_segments"]),
                      tensor=TensorSpec.from_mapping(data["tensor"], f"{where}.tensor"),
                      head=None if data.get("head") is None else str(data["head"]),
                      tail=None if data.get("tail") is None else str(data["tail"]),
                      max_rel_error=float(data.get("max_rel_error", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed cut ({exc})") from exc
        if cut.kind not in CUT_KINDS:
            raise ArtifactError(f"{where}: kind {cut.kind!r}, expected one of {list(CUT_KINDS)}")
        if (cut.kind == "inner") != (cut.head is not None and cut.tail is not None):
            raise ArtifactError(f"{where}: an inner cut needs head and tail graphs, other kinds none")
        return cut


def _check_cuts(variant: BundleVariant, cuts: tuple[Cut, ...], where: str) -> None:
    last = variant.exit_stage
    for i, cut in enumerate(cuts):
        if cut.index != i:
            raise ArtifactError(f"{where}: cut {i} has index {cut.index}")
        if not 0 <= cut.device_segments <= last:
            raise ArtifactError(f"{where}: cut {i} keeps {cut.device_segments} segments on the device; the variant "
                                f"has {last + 1} and the last must run on the peer")
        if cut.kind == "input" and (cut.device_segments != 0 or cut.tensor.shape != variant.segments[0].input.shape):
            raise ArtifactError(f"{where}: cut {i} (input) must keep no segment and carry the input")
        if cut.kind == "boundary":
            out = variant.segments[cut.device_segments - 1].output if cut.device_segments else None
            if out is None or out.shape != cut.tensor.shape:
                raise ArtifactError(f"{where}: cut {i} (boundary) does not carry segment "
                                    f"{cut.device_segments - 1}'s output")


@dataclass(frozen=True)
class OffloadPlan:
    """Every variant's cuts (``arch_id -> cuts`` in chain order)."""

    cuts: dict[str, tuple[Cut, ...]]

    def for_variant(self, arch_id: str) -> tuple[Cut, ...]:
        return self.cuts.get(arch_id, ())

    def to_json_dict(self) -> dict[str, Any]:
        return {"version": OFFLOAD_PLAN_VERSION,
                "variants": {a: [c.to_json_dict() for c in cuts] for a, cuts in sorted(self.cuts.items())}}

    @classmethod
    def from_mapping(cls, data: Any, bundle: Bundle, where: str) -> OffloadPlan:
        if not isinstance(data, Mapping) or data.get("version") != OFFLOAD_PLAN_VERSION:
            raise ArtifactError(f"{where}: expected an object with version {OFFLOAD_PLAN_VERSION}")
        variants = data.get("variants")
        if not isinstance(variants, Mapping):
            raise ArtifactError(f"{where}: 'variants' must map arch ids to cut lists")
        cuts: dict[str, tuple[Cut, ...]] = {}
        for arch_id, entries in variants.items():
            variant = bundle.spec.variant(str(arch_id))
            if not isinstance(entries, list):
                raise ArtifactError(f"{where}: variants[{arch_id!r}] must be a list")
            parsed = tuple(Cut.from_mapping(e, f"{where}: {arch_id}[{i}]") for i, e in enumerate(entries))
            _check_cuts(variant, parsed, f"{where}: {arch_id}")
            for cut in parsed:
                if cut.tail is not None:
                    bundle.path(cut.tail)  # both sides run tails (the device as its fallback)
            cuts[str(arch_id)] = parsed
        return cls(cuts)


def has_file(bundle: Bundle, relative: str) -> bool:
    return any(record.path == relative for record in bundle.artifact.manifest.files)


def graphs_sha256(bundle: Bundle, variant: BundleVariant, cuts: tuple[Cut, ...]) -> str:
    """One digest of what both halves of an offload bundle hold for ``variant``: its segments and
    exit heads in ONNX and its cuts' tails (the manifest's sha256 of each) and the cuts themselves
    (index, kind, tensor). A device and a peer agree on it only when they were split from the same
    build of that variant and number its cuts alike (a plain bundle's stage-boundary cuts are not
    an offload split's)."""
    digests = {record.path: record.sha256 for record in bundle.artifact.manifest.files}
    paths = sorted({g.onnx for g in variant.graphs()} | {c.tail for c in cuts if c.tail is not None})
    lines = [f"{path} {digests.get(path, '-')}" for path in paths]
    lines += [f"cut {c.index} {c.kind} {c.device_segments} {c.tensor.name} {list(c.tensor.shape)}" for c in cuts]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def boundary_cuts(variant: BundleVariant) -> tuple[Cut, ...]:
    """The input cut and one cut per stage boundary before the variant's exit."""
    cuts = [Cut(0, "input", 0, variant.segments[0].input)]
    for k in range(variant.exit_stage):
        cuts.append(Cut(len(cuts), "boundary", k + 1, variant.segments[k].output))
    return tuple(cuts)


def boundary_plan(bundle: Bundle) -> OffloadPlan:
    return OffloadPlan({v.arch_id: boundary_cuts(v) for v in bundle.spec.variants})


def load_plan(bundle: Bundle) -> OffloadPlan:
    """``offload.json`` when the bundle has one, else the stage-boundary cuts of every variant."""
    if not has_file(bundle, OFFLOAD_PLAN_NAME):
        return boundary_plan(bundle)
    return OffloadPlan.from_mapping(bundle.artifact.read_json(OFFLOAD_PLAN_NAME), bundle,
                                    str(bundle.root / OFFLOAD_PLAN_NAME))
