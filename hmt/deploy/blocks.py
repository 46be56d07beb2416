"""``deploy --blocks``: ship a variant family as shared block graphs instead of whole copies.

The bundled variants span a *sub-space* of the supernet's space: at every position the
choices some bundled variant takes there, at every stage the stream widths, and the exits.
deploy writes one ONNX graph per distinct unit of that sub-space (the stem, each block
position x choice x stream widths, each exit head; :mod:`hmt.runtime.blocks` names them),
``blocks/blocks.json`` describing them, and optionally a small labelled calibration set.
The device composes any variant of the sub-space by chaining the unit sessions; a variant
composed so answers as the whole-variant graph made of the same units (tests: <= 1e-5).
Any supernet with ``space``, ``original_units``, ``stage_entries()``, ``variant_units(arch)``,
``unit_module(unit)`` and ``block_input_shapes()`` can ship so: a preset one
(``hmt.supernet.supernet.Supernet``, whose original variant alone runs the original's modules) and
an elastified one (``hmt.supernet.elastify``, whose every variant runs the original's frozen blocks
wherever a ``base`` choice reads and writes full streams).

BN statistics. A bundled whole variant has its own statistics (re-estimated on the
supernet's calibration set for that variant alone, ``hmt.supernet.calibrate``); a unit
shared by many variants can hold one set. The units some bundled variant runs take their
statistics over the bundled variants alone; the others (run only by other variants of the
sub-space) over ``extra`` seeded samples of it, every forward counting the same
(:func:`calibrate_units`; the original network's layers keep theirs, as everywhere: an
elastified supernet's frozen stem, blocks and head, opaque leaves included). A bundled variant
whose re-estimated units no other bundled variant runs composes as its whole graph answers
(the same statistics: by default the same calibration images in the same batches); one sharing
such a unit with another bundled variant gets their average there. Accuracy on the shipped
calibration set is measured here for the bundled variants (``accuracy`` in blocks.json) and on
the device for any other (re-search), on the same set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hmt.artifacts import ArtifactWriter
from hmt.errors import NPZ_ERRORS, ModelError, UsageError
from hmt.runtime.blocks import (
    BLOCKS_SPEC_NAME,
    BLOCKS_SPEC_VERSION,
    NOT_EXECUTED,
    ORIGINALS,
    STREAM_COMPATIBLE,
    WIDTH_KIND,
    Unit,
    base_unit,
    unit_file,
    unit_key,
)

CALIBRATION_NAME = "blocks/calibration.npz"
CALIBRATION_MAX_SAMPLES = 256


@dataclass(frozen=True)
class BlocksOptions:
    extra_variants: int = 8  # seeded sub-space samples the units' BN statistics are re-estimated over too
    bn_samples: int | None = None  # of the supernet's calibration images (None: all, as the bundled whole variants)
    data: Path | None = None  # labelled .npz (x: model inputs, y: labels) shipped as blocks/calibration.npz
    max_samples: int = CALIBRATION_MAX_SAMPLES
    seed: int = 0


@dataclass(frozen=True)
class SubSpace:
    choices: tuple[tuple[str, ...], ...]  # per position, in the space's order of choices
    widths: tuple[tuple[str, ...], ...]  # per stage
    exits: tuple[int, ...]


def sub_space(space: Any, archs: Sequence[Any]) -> SubSpace:
    """The sub-space the configs ``archs`` span (see the module docstring)."""
    choices = []
    for p, pos in enumerate(space.positions):
        used = {a.choices[p] for a in archs} - {NOT_EXECUTED}
        choices.append(tuple(c for c in pos.choices if c in used) or (pos.choices[0],))
    widths = []
    for s in range(space.num_stages):
        used = {space.stage_widths(a)[s] for a in archs if a.exit_stage >= s}
        widths.append(tuple(w for w in ("base", "w75", "w50", "w25") if w in used) or ("base",))
    return SubSpace(tuple(choices), tuple(widths), tuple(sorted({a.exit_stage for a in archs})))


def supernet_originals(net: Any) -> str:
    """Which units of ``net`` run the original's modules (``net.original_units``, one of
    :data:`hmt.runtime.blocks.ORIGINALS`); UsageError for a supernet that does not say."""
    originals = getattr(net, "original_units", None)
    if originals not in ORIGINALS:
        raise UsageError(f"--blocks: a {type(net).__name__} does not say which of its units are the original's "
                         f"(original_units, one of {list(ORIGINALS)}); its variants cannot be shipped as blocks")
    return str(originals)


def sub_space_units(net: Any, sub: SubSpace) -> list[Unit]:
    """Every unit a config of ``sub`` can run (in the supernet's order, no duplicates); ``net`` is any
    supernet with ``space``, ``original_units``, ``stage_entries()`` and ``variant_units(arch)``."""
    space = net.space
    originals = supernet_originals(net)
    entries = net.stage_entries()
    units: list[Unit] = [("stem", 0, unit_key(base_unit(originals, False, "base", w), "base", w))
                         for w in sub.widths[0]]
    last = space.num_stages - 1
    for s in range(max(sub.exits) + 1):
        previous = sub.widths[s - 1] if s > 0 else sub.widths[0]
        if entries[s]:
            units += [("entry", s, unit_key("base", w, w)) for w in previous]
        for p, pos in enumerate(space.positions):
            if pos.stage != s or pos.kind == WIDTH_KIND:
                continue
            for out_w in sub.widths[s]:
                for in_w in (previous if pos.index == 0 and s > 0 else (out_w,)):
                    slim = (in_w, out_w) != ("base", "base")
                    for choice in sub.choices[p]:
                        copy = choice == "base" or (slim and choice not in STREAM_COMPATIBLE)
                        key = base_unit(originals, False, in_w, out_w) if copy else choice
                        units.append(("block", p, unit_key(key, in_w, out_w)))
        units += [("exit", s, unit_key(base_unit(originals, False, w, w) if s == last else "base", w, w))
                  for w in sub.widths[s]]
    # The original network (every choice base, full streams) runs its own frozen modules.
    for e in sub.exits:
        if all("base" in sub.choices[p] for p, pos in enumerate(space.positions) if pos.stage <= e):
            original = space.make(["base"] * len(space.positions), e)
            found, _, exits = net.variant_units(original)
            units += [*found, *exits.values()]
    return list(dict.fromkeys(units))


def sample_sub_space(space: Any, sub: SubSpace, rng: np.random.Generator) -> Any:
    exit_stage = int(sub.exits[int(rng.integers(len(sub.exits)))])
    picks = [c[int(rng.integers(len(c)))] for c in sub.choices]
    return space.make(picks, exit_stage)


def covering_samples(net: Any, sub: SubSpace, chosen: Sequence[Any], units: set[Unit], rng: np.random.Generator,
                     tries: int = 4000) -> list[Any]:
    """Seeded samples of the sub-space, each running a unit none of ``chosen`` (nor an earlier sample)
    runs, until every unit is run by some variant: a unit no calibration variant runs would keep
    the supernet's shared statistics (the largest network's), which a composed variant measured
    at 23% accuracy where its neighbours had 73%."""
    def used(arch: Any) -> set[Unit]:
        found, _, exits = net.variant_units(arch)
        return set(found) | set(exits.values())

    covered: set[Unit] = set().union(*(used(a) for a in chosen)) if chosen else set()
    out: list[Any] = []
    for _ in range(tries):
        if units <= covered:
            break
        arch = sample_sub_space(net.space, sub, rng)
        new = used(arch) - covered
        if new:
            out.append(arch)
            covered |= new
    return out


class UnitModules:
    """One eval-mode module per unit, shared by every variant composed from them (torch)."""

    def __init__(self, net: Any, units: Sequence[Unit]) -> None:
        self.net = net
        self.modules = {u: net.unit_module(u) for u in units}

    def compose(self, arch: Any) -> Any:
        """``arch`` as a VariantModule whose segments hold the shared unit modules (not copies)."""
        from torch import nn

        from hmt.supernet.supernet import VariantModule

        units, stage_end, exits = self.net.variant_units(arch)
        missing = [u for u in [*units, *exits.values()] if u not in self.modules]
        if missing:
            raise ModelError(f"variant {arch.arch_id} needs units outside the shipped sub-space: {missing[:3]}")
        segments: list[nn.Module] = []
        heads: list[nn.Module] = []
        begin = 0
        for s in range(arch.exit_stage + 1):
            segments.append(nn.Sequential(*[self.modules[u] for u in units[begin:stage_end[s]]]))
            heads.append(self.modules[exits[s]])
            begin = stage_end[s]
        return VariantModule(segments, heads, tuple(self.net.space.input_shape), arch.arch_id).eval()

    def calibrate(self, archs: Sequence[Any], batches: Sequence[Any]) -> int:
        """Re-estimate the units' BN statistics over ``archs`` on ``batches``: each BN's average over
        every forward through it (``hmt.supernet.calibrate.recalibrate_bn`` on all of them at once)."""
        from torch import nn

        from hmt.supernet.calibrate import recalibrate_bn

        variants = [self.compose(a) for a in archs]

        class _All(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.variants = nn.ModuleList(variants)

            def forward_all(self, x: Any) -> None:
                for v in self.variants:
                    v.forward_all(x)  # type: ignore[operator]

        everything = _All()
        seen = recalibrate_bn(everything, batches)
        everything.eval()
        return seen

    def input_shape(self, unit: Unit) -> tuple[int, ...]:
        from hmt.supernet.blocks import width_channels
        from hmt.supernet.supernet import parse_unit_key

        kind, index, key = unit
        _, in_w, _ = parse_unit_key(key)
        shapes = self.net.block_input_shapes()
        name = {"stem": "stem", "entry": f"s{index}.entry", "exit": f"exit{index}"}.get(kind)
        shape = shapes[name if name is not None else self.net.space.positions[index].name]
        return (width_channels(shape[0], in_w), *shape[1:])


def calibrate_units(modules: UnitModules, bundled: Sequence[Any], extra: Sequence[Any], batches: Sequence[Any]) -> int:
    """BN statistics of the units: over the sub-space samples ``extra`` first (they reach the units no
    bundled variant runs), then, for the units some bundled variant runs, over the bundled variants alone, so
    a bundled variant composed from blocks answers as its whole graph does. Averaged with the
    sub-space samples, the units a specialized variant alone runs took statistics of inputs it never
    sees: the shipped supernet's specialized variant composed at 62% where its whole graph scored
    100% on the same training images."""
    if extra:  # resets only the units its variants run; those a bundled variant runs too are reset next
        modules.calibrate(extra, batches)
    return modules.calibrate(bundled, batches)


def export_unit(module: Any, shape: tuple[int, ...], path: Path) -> tuple[list[int], str]:
    """``module`` as ONNX at ``path``, batch dimension dynamic; its output shape (batch 1) and dtype."""
    import contextlib
    import io
    import warnings

    import torch

    example = torch.zeros(1, *shape)
    with torch.no_grad():
        out = module(example)
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (example,), str(path), input_names=["x"], output_names=["y"], opset_version=17,
                              dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, do_constant_folding=True,
                              dynamo=False)
    except Exception as exc:
        raise ModelError(f"cannot export unit to ONNX ({type(exc).__name__}: {str(exc)[:300]})") from exc
    return list(out.shape), "float32"


def is_identity(path: Path) -> bool:
    """Whether the ONNX graph at ``path`` is one Identity node (a skipped block on its stream)."""
    import onnx

    graph = onnx.load(str(path)).graph
    return len(graph.node) == 1 and graph.node[0].op_type == "Identity" and not graph.initializer


def read_labelled(source: Path, input_shape: Sequence[int] | None, *, seed: int, max_samples: int,
                  num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """A seeded subset of the labelled set ``source`` (x: float model inputs, y: integer labels, each a
    class index below ``num_classes``); ``input_shape`` and ``num_classes`` None check all but the shape
    and the largest label (deploy's check before any work)."""
    try:
        with np.load(source, allow_pickle=False) as archive:
            x, y = np.asarray(archive["x"]), np.asarray(archive["y"])
    except NPZ_ERRORS as exc:
        raise UsageError(f"--blocks-data {source}: expected an .npz with x (model inputs) and y (labels) "
                         f"({exc})") from exc
    shape_ok = input_shape is None or (x.ndim == len(input_shape) + 1 and tuple(x.shape[1:]) == tuple(input_shape))
    if not shape_ok or not np.issubdtype(x.dtype, np.floating) or not np.all(np.isfinite(x)):
        shown = "N, ..." if input_shape is None else f"N, {', '.join(map(str, input_shape))}"
        raise UsageError(f"--blocks-data {source}: x must be finite float model inputs of shape [{shown}] "
                         f"(normalised as the bundle's preprocessing), got {x.dtype} {list(x.shape)}")
    if y.ndim != 1 or len(y) != len(x) or not len(y) or not np.issubdtype(y.dtype, np.integer):
        raise UsageError(f"--blocks-data {source}: y must be a non-empty vector of {len(x)} integer labels")
    if y.min() < 0 or (num_classes is not None and y.max() >= num_classes):
        # Labels of another numbering (1-based, another dataset's) scored every variant 0 %: re-search's
        # accuracy floor then let any candidate through.
        classes = "0 or more" if num_classes is None else f"0..{num_classes - 1}"
        raise UsageError(f"--blocks-data {source}: y must be class indices {classes}, got {int(y.min())}.."
                         f"{int(y.max())}")
    keep = np.sort(np.random.default_rng(seed).permutation(len(y))[:max_samples])
    return x[keep].astype(np.float32), y[keep].astype(np.int64), len(y)


def _accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    import torch

    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(x[i:i + 128])) for i in range(0, len(x), 128)])
    return float((logits.argmax(1).numpy() == y).mean())


def write_blocks(writer: ArtifactWriter, loaded: Any, arch_ids: Sequence[str], options: BlocksOptions,
                 progress: Any = None) -> dict[str, Any]:
    """Write ``blocks/`` for the variants ``arch_ids`` of ``loaded`` (a LoadedSupernet) into the
    artifact being written; returns a summary (units, bytes, exits, notes) and ``modules``, the
    calibrated :class:`UnitModules` the graphs were exported from."""
    from hmt.pareto.data import calibration_batches

    net, space = loaded.net, loaded.space
    archs = [space.parse(a) for a in arch_ids]
    sub = sub_space(space, archs)
    units = sub_space_units(net, sub)
    modules = UnitModules(net, units)
    rng = np.random.default_rng(options.seed)
    extra = [sample_sub_space(space, sub, rng) for _ in range(options.extra_variants)]
    extra += covering_samples(net, sub, [*archs, *extra], set(units), rng)
    batches = calibration_batches(loaded, max_samples=options.bn_samples)
    if batches is None:
        raise ModelError(f"{loaded.artifact.root}: the supernet stores no calibration images; --blocks re-estimates "
                         "the shared blocks' BN statistics on them")
    if options.bn_samples is None:  # every image, batched as the bundled whole variants were calibrated
        batches = loaded.calibration_batches()
    seen = calibrate_units(modules, archs, extra, batches)
    records: list[dict[str, Any]] = []
    writer.path(f"{unit_file(units[0])}").parent.mkdir(parents=True, exist_ok=True)
    for i, unit in enumerate(units):
        if progress is not None:
            progress("blocks", i, len(units), None)
        shape = modules.input_shape(unit)
        path = writer.path(unit_file(unit))
        out_shape, dtype = export_unit(modules.modules[unit], shape, path)
        records.append({"kind": unit[0], "index": unit[1], "key": unit[2], "onnx": unit_file(unit),
                        "input": {"name": "x", "shape": [1, *shape], "dtype": "float32"},
                        "output": {"name": "y", "shape": out_shape, "dtype": dtype},
                        "size_bytes": path.stat().st_size, "identity": is_identity(path)})
    doc: dict[str, Any] = {
        "version": BLOCKS_SPEC_VERSION, "space_tag": space.tag, "num_stages": space.num_stages,
        "positions": [{"name": p.name, "stage": p.stage, "index": p.index, "kind": p.kind,
                       "choices": list(sub.choices[i])} for i, p in enumerate(space.positions)],
        "entries": list(net.stage_entries()), "originals": supernet_originals(net),
        "exits": list(sub.exits), "units": records, "accuracy": {}, "calibration": None,
        "bn": {"method": "shared statistics re-estimated over the bundled variants and seeded sub-space samples",
               "variants": len(archs) + len(extra), "samples": seen,
               "seed": options.seed},
    }
    notes = [f"{BLOCKS_SPEC_NAME}: {len(units)} shared block graphs composing any of the sub-space's variants "
             f"(serve --blocks); BN statistics shared over {len(archs) + len(extra)} variants"]
    if options.data is not None:
        x, y, total = read_labelled(options.data, space.input_shape, seed=options.seed, max_samples=options.max_samples,
                                    num_classes=space.num_classes)
        with open(writer.path(CALIBRATION_NAME), "wb") as handle:
            np.savez(handle, x=x, y=y)
        doc["calibration"] = {"path": CALIBRATION_NAME, "samples": len(y), "of": total, "seed": options.seed}
        doc["accuracy"] = {a.arch_id: _accuracy(modules.compose(a), x, y) for a in archs}
        notes.append(f"{CALIBRATION_NAME}: {len(y)} labelled samples (of {total}); composed variants' accuracy on "
                     "it in blocks.json, and on-device re-search measures candidates on it")
    else:
        notes.append("no labelled calibration set (deploy --blocks-data): serve composes variants from blocks but "
                     "cannot re-search (a new variant's accuracy would be unknown)")
    writer.write_json(BLOCKS_SPEC_NAME, doc)
    if progress is not None:
        progress("blocks", len(units), len(units), None)
    size_bytes = sum(r["size_bytes"] for r in records)
    return {"units": len(units), "size_bytes": size_bytes, "exits": list(sub.exits), "notes": notes,
            "calibration_samples": None if doc["calibration"] is None else doc["calibration"]["samples"],
            "modules": modules}


def whole_variant_onnx(modules: UnitModules, arch: Any, path: Path) -> Path:
    """``arch`` composed of the shared unit modules, exported as ONE graph (segments and the last
    head): the whole-variant graph a composed chain must answer as (tests)."""
    from torch import nn

    variant = modules.compose(arch)

    class _Whole(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.v = variant

        def forward(self, x: Any) -> Any:
            return self.v(x)

    export_unit(_Whole().eval(), tuple(modules.net.space.input_shape), path)
    return path
