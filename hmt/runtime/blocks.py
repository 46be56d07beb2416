"""Variants composed from shared block graphs (``deploy --blocks``), torch-free.

A bundle built with ``--blocks`` carries, under ``blocks/``, one ONNX graph per distinct
*unit* its shipped sub-space uses: the stem, each (block position, choice, stream widths)
and each exit head (``hmt.deploy.blocks`` writes them). ``blocks/blocks.json`` describes
the sub-space (the positions and the choices each may take, the stream widths of every
stage, the exits) and lists the units with their files; every file is in the manifest.

:class:`BlockSpace` canonicalises a choice list as ``hmt.supernet.space.SearchSpace.make``
does and lists the units a variant runs, as ``Supernet.variant_units`` (a preset supernet) or
``ElastifiedSupernet.variant_units`` (a user's model cut by elastify) does: ``originals`` in
blocks.json says which of the two keys ``base`` choices (tests check both against the torch
side). :class:`BlockStore` loads unit graphs on demand, each once, however many variants use
it; :func:`compose` builds a :class:`~hmt.runtime.chain.ChainRunner` for any variant of the
sub-space from them (segments = chains of unit sessions).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Tuple

import numpy as np

from hmt.artifacts.jsondoc import parse_json
from hmt.bundle import Bundle, TensorSpec
from hmt.errors import NPZ_ERRORS, ArtifactError, HmtError, ModelError, UsageError
from hmt.runtime.chain import ChainRunner, GraphFn

BLOCKS_DIR = "blocks"
BLOCKS_SPEC_NAME = "blocks/blocks.json"
BLOCKS_SPEC_VERSION = 1
# Mirrors of hmt.supernet.space / hmt.supernet.blocks (pure data; the tests check they agree).
CHOICE_CODES = {"base": "B", "w75": "7", "w50": "5", "w25": "2", "lr50": "L", "lr25": "l", "dws": "D",
                "fire": "F", "k1": "K", "ghost": "G", "skip": "S", "merge": "M", "-": "x"}
CODE_CHOICES = {code: choice for choice, code in CHOICE_CODES.items()}
NOT_EXECUTED = "-"
WIDTH_KIND = "width"
WIDTH_CHOICES = ("base", "w75", "w50", "w25")
STREAM_COMPATIBLE = ("base", "w75", "w50", "w25", "skip")
SLIM_FULL = "full"  # the weight-shared copy of a block's base path (every variant but the original)
# Which variants run the original network's own modules for a ``base`` choice (blocks.json
# ``originals``): a preset supernet's original variant only (every other variant runs the shared
# copies, ``full``); an elastified supernet's every variant wherever the unit reads and writes
# full streams (its original blocks are frozen and shared; the copies exist only slim).
ORIGINALS_VARIANT = "original-variant"
ORIGINALS_FULL_STREAM = "full-stream"
ORIGINALS = (ORIGINALS_VARIANT, ORIGINALS_FULL_STREAM)

Unit = Tuple[str, int, str]  # (kind: stem | entry | block | exit, index, key)


def unit_key(choice: str, in_width: str, out_width: str) -> str:
    """A unit's key: the choice alone on the full stream, else ``choice/<in><out>`` in codes."""
    if in_width == "base" and out_width == "base":
        return choice
    return f"{choice}/{CHOICE_CODES[in_width]}{CHOICE_CODES[out_width]}"


def base_unit(originals: str, original_variant: bool, in_width: str, out_width: str) -> str:
    """The choice a unit running a ``base`` choice is keyed by: ``base`` (the original network's
    module) or ``full`` (its weight-shared copy), under rule ``originals`` (see ORIGINALS)."""
    if originals == ORIGINALS_FULL_STREAM:
        return "base" if (in_width, out_width) == ("base", "base") else SLIM_FULL
    return "base" if original_variant else SLIM_FULL


def unit_file(unit: Unit) -> str:
    """A unit's graph file under ``blocks/`` (no '/' from the key; choice names, not case-only codes)."""
    kind, index, key = unit
    choice, _, widths = key.partition("/")
    return f"{BLOCKS_DIR}/{kind}{index}.{choice}" + (f".{widths}" if widths else "") + ".onnx"


@dataclass(frozen=True)
class Position:
    name: str
    stage: int
    index: int
    kind: str
    choices: tuple[str, ...]  # the choices of the shipped sub-space at this position


@dataclass(frozen=True)
class UnitSpec:
    unit: Unit
    onnx: str
    input: TensorSpec
    output: TensorSpec
    size_bytes: int
    identity: bool = False  # the graph is one Identity node (a skipped block): composed without a session


@dataclass(frozen=True)
class Config:
    """One variant of the sub-space: its exit and a choice per position (canonical)."""

    space_tag: str
    exit_stage: int
    choices: tuple[str, ...]

    @property
    def arch_id(self) -> str:
        return f"{self.space_tag}.e{self.exit_stage}." + "".join(CHOICE_CODES[c] for c in self.choices)


@dataclass
class BlockSpace:
    """``blocks.json``: the shipped sub-space and its units (see the module docstring)."""

    space_tag: str
    num_stages: int
    positions: tuple[Position, ...]
    entries: tuple[bool, ...]  # whether stage s has an entry unit
    exits: tuple[int, ...]  # the exit stages of the sub-space
    units: dict[Unit, UnitSpec]
    accuracy: dict[str, float] = field(default_factory=dict)  # composed variants' accuracy on the calibration set
    calibration: str | None = None  # the labelled calibration set's file, if shipped
    notes: tuple[str, ...] = ()
    originals: str = ORIGINALS_VARIANT  # which units run the original's modules (see ORIGINALS)

    # -- reading ---------------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Any, where: str = BLOCKS_SPEC_NAME) -> BlockSpace:
        if not isinstance(data, Mapping) or data.get("version") != BLOCKS_SPEC_VERSION:
            raise ArtifactError(f"{where}: expected a JSON object of version {BLOCKS_SPEC_VERSION}")
        try:
            positions = tuple(Position(str(p["name"]), int(p["stage"]), int(p["index"]), str(p["kind"]),
                                       tuple(str(c) for c in p["choices"])) for p in data["positions"])
            units: dict[Unit, UnitSpec] = {}
            for i, u in enumerate(data["units"]):
                unit = (str(u["kind"]), int(u["index"]), str(u["key"]))
                where_unit = f"{where}: units[{i}]"
                units[unit] = UnitSpec(unit, str(u["onnx"]), TensorSpec.from_mapping(u["input"], where_unit),
                                       TensorSpec.from_mapping(u["output"], where_unit), int(u["size_bytes"]),
                                       bool(u.get("identity", False)))
            space = cls(space_tag=str(data["space_tag"]), num_stages=int(data["num_stages"]), positions=positions,
                        entries=tuple(bool(e) for e in data["entries"]), exits=tuple(int(e) for e in data["exits"]),
                        units=units, accuracy={str(k): float(v) for k, v in dict(data.get("accuracy", {})).items()},
                        calibration=None if data.get("calibration") is None else str(data["calibration"]["path"]),
                        notes=tuple(str(n) for n in data.get("notes", ())),
                        originals=str(data.get("originals", ORIGINALS_VARIANT)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed ({exc})") from exc
        if len(space.entries) != space.num_stages or not space.exits or not space.positions:
            raise ArtifactError(f"{where}: needs one entry flag per stage, exits and positions")
        if space.originals not in ORIGINALS:
            raise ArtifactError(f"{where}: originals {space.originals[:40]!r} is none of {list(ORIGINALS)} "
                                "(a newer hmt wrote these blocks?)")
        for spec in units.values():
            if spec.onnx != unit_file(spec.unit):
                raise ArtifactError(f"{where}: unit {spec.unit} names file {spec.onnx[:80]!r}, "
                                    f"expected {unit_file(spec.unit)!r}")
        return space

    # -- configs ---------------------------------------------------------------------------

    def _widths(self, choices: Sequence[str]) -> dict[int, str]:
        return {p.stage: (c if c in WIDTH_CHOICES else "base")
                for p, c in zip(self.positions, choices) if p.kind == WIDTH_KIND}

    def make(self, choices: Sequence[str], exit_stage: int) -> Config:
        """Canonicalise as ``SearchSpace.make`` (past the exit or under a merge: '-'; an operator on
        a slimmed stream: its slim copy, ``base``); UsageError for a choice outside the sub-space."""
        if len(choices) != len(self.positions):
            raise UsageError(f"expected {len(self.positions)} choices, got {len(choices)}")
        if exit_stage not in self.exits:
            raise UsageError(f"exit {exit_stage} is not shipped (exits {list(self.exits)})")
        widths = self._widths(choices)
        out: list[str] = []
        covered = False
        for pos, choice in zip(self.positions, choices):
            if pos.stage > exit_stage or covered:
                out.append(NOT_EXECUTED)
                covered = False
                continue
            if choice not in pos.choices:
                raise UsageError(f"block {pos.name}: choice {choice!r} not in the shipped {list(pos.choices)}")
            if pos.kind != WIDTH_KIND and choice not in STREAM_COMPATIBLE and self._slim(pos, widths):
                choice = "base"
            out.append(choice)
            covered = choice == "merge"
        return Config(self.space_tag, exit_stage, tuple(out))

    @staticmethod
    def _slim(pos: Position, widths: Mapping[int, str]) -> bool:
        out_w = widths.get(pos.stage, "base")
        in_w = widths.get(pos.stage - 1, "base") if pos.index == 0 and pos.stage > 0 else out_w
        return out_w != "base" or in_w != "base"

    def parse(self, arch_id: str) -> Config:
        """An arch id of this space as a config of the sub-space (UsageError otherwise)."""
        parts = arch_id.split(".")
        if len(parts) != 3 or parts[0] != self.space_tag or not parts[1].startswith("e"):
            raise UsageError(f"arch id {arch_id!r} is not a variant of space {self.space_tag!r}")
        try:
            exit_stage = int(parts[1][1:])
            choices = [CODE_CHOICES[c] for c in parts[2]]
        except (ValueError, KeyError) as exc:
            raise UsageError(f"arch id {arch_id!r}: bad exit or block code ({exc})") from exc
        config = self.make([c if c != NOT_EXECUTED else "base" for c in choices], exit_stage)
        if config.arch_id != arch_id:
            raise UsageError(f"arch id {arch_id!r} is not canonical (did you mean {config.arch_id!r}?)")
        return config

    def stage_widths(self, config: Config) -> list[str]:
        widths = self._widths([c if c != NOT_EXECUTED else "base" for c in config.choices])
        return [widths.get(s, "base") for s in range(self.num_stages)]

    def units_of(self, config: Config) -> tuple[list[Unit], dict[int, int], dict[int, Unit]]:
        """The units ``config`` runs in order, {stage: units done when it ends}, each stage's exit unit
        (as ``Supernet.variant_units``)."""
        widths = self.stage_widths(config)
        original = all(c in ("base", NOT_EXECUTED) for c in config.choices)

        def base(in_w: str, out_w: str) -> str:
            return base_unit(self.originals, original, in_w, out_w)

        units: list[Unit] = [("stem", 0, unit_key(base("base", widths[0]), "base", widths[0]))]
        stage_end: dict[int, int] = {}
        exits: dict[int, Unit] = {}
        for s in range(config.exit_stage + 1):
            previous = widths[s - 1] if s > 0 else widths[0]
            if self.entries[s]:
                units.append(("entry", s, unit_key("base", previous, previous)))
            for p, pos in enumerate(self.positions):
                choice = config.choices[p]
                if pos.stage != s or choice == NOT_EXECUTED or pos.kind == WIDTH_KIND:
                    continue
                in_w = previous if pos.index == 0 else widths[s]
                units.append(("block", p, unit_key(base(in_w, widths[s]) if choice == "base" else choice, in_w,
                                                   widths[s])))
            stage_end[s] = len(units)
            head = base(widths[s], widths[s]) if s == self.num_stages - 1 else "base"
            exits[s] = ("exit", s, unit_key(head, widths[s], widths[s]))
        return units, stage_end, exits

    def composable(self, config: Config) -> bool:
        """Whether every unit ``config`` runs is shipped."""
        units, _, exits = self.units_of(config)
        return all(u in self.units for u in [*units, *exits.values()])

    def footprint_bytes(self, config: Config) -> int:
        """Bytes of the unit graphs ``config`` runs (each once) plus its largest activation pair."""
        units, _, exits = self.units_of(config)
        used = set(units) | set(exits.values())
        weights = sum(self.units[u].size_bytes for u in used)
        return weights + max(_tensor_bytes(self.units[u].input) + _tensor_bytes(self.units[u].output) for u in used)


def _tensor_bytes(spec: TensorSpec) -> int:
    count = 1
    for d in spec.shape:
        count *= d
    return count * np.dtype(spec.dtype).itemsize


def has_blocks(bundle: Bundle) -> bool:
    """Whether ``bundle`` ships block graphs (its manifest lists ``blocks/blocks.json``)."""
    return any(record.path == BLOCKS_SPEC_NAME for record in bundle.artifact.manifest.files)


def load_block_space(bundle: Bundle) -> BlockSpace:
    """``blocks/blocks.json`` of ``bundle`` (checked against the manifest), ArtifactError if absent."""
    from hmt.runtime.verified import read_verified

    data = parse_json(read_verified(bundle.artifact, BLOCKS_SPEC_NAME), bundle.root / BLOCKS_SPEC_NAME)
    space = BlockSpace.from_mapping(data, str(bundle.root / BLOCKS_SPEC_NAME))
    for spec in space.units.values():
        bundle.artifact.file(spec.onnx)  # listed in the manifest, inside the bundle
    if space.calibration is not None:
        bundle.artifact.file(space.calibration)
    return space


class BlockStore:
    """Unit sessions of one bundle, each loaded once and shared by every variant composed from it.

    ``acquire(units)`` loads what is missing and counts one more user of each; ``release``
    counts one less and drops a unit nobody uses (a request still running it keeps its
    reference). ``loaded_bytes`` counts each loaded unit once."""

    def __init__(self, bundle: Bundle, space: BlockSpace, *, threads: int = 1,
                 providers: Sequence[str] = ("cpu",)) -> None:
        self.bundle = bundle
        self.space = space
        self.threads = threads
        self.providers = tuple(providers)
        self._fns: dict[Unit, GraphFn] = {}
        self._users: dict[Unit, int] = {}
        self._lock = threading.Lock()
        self.loads = 0
        self.unloads = 0

    def _load(self, unit: Unit) -> GraphFn:
        from dataclasses import replace

        from hmt.runtime.ort import ort_session
        from hmt.runtime.variant import SERVE_DEFAULT_ORT
        from hmt.runtime.verified import read_verified

        spec = self.space.units.get(unit)
        if spec is None:
            raise ModelError(f"unit {unit} is not shipped in {self.bundle.root / BLOCKS_DIR}")
        # No per-session arena or memory pattern: a composed variant is tens of small sessions, and
        # each arena keeps its own reserve (measured on the demo bundle's 4 variants, 94 sessions:
        # 36 MB resident with arenas, 26 MB without; the composed run no slower).
        options = replace(SERVE_DEFAULT_ORT, intra_op_threads=self.threads, cpu_arena=False, mem_pattern=False)
        session = ort_session(read_verified(self.bundle.artifact, spec.onnx), options, providers=self.providers,
                              what=str(self.bundle.root / spec.onnx))
        self.loads += 1
        return session.graph_fn()

    def acquire(self, units: Sequence[Unit]) -> list[GraphFn]:
        """The unit graphs' functions, loading the missing ones; an identity unit runs no session."""
        with self._lock:
            fns: list[GraphFn] = []
            for unit in units:
                spec = self.space.units.get(unit)
                if spec is not None and spec.identity:
                    fns.append(_identity)
                    continue
                fn = self._fns.get(unit)
                if fn is None:
                    fn = self._fns[unit] = self._load(unit)
                fns.append(fn)
            for unit in set(units) - {u for u in units if self.space.units[u].identity}:
                self._users[unit] = self._users.get(unit, 0) + 1
            return fns

    def release(self, units: Sequence[Unit]) -> None:
        with self._lock:
            for unit in set(units):
                left = self._users.get(unit, 0) - 1
                if left > 0:
                    self._users[unit] = left
                    continue
                self._users.pop(unit, None)
                if self._fns.pop(unit, None) is not None:
                    self.unloads += 1

    def loaded_units(self) -> list[Unit]:
        return list(self._fns)

    def loaded_bytes(self) -> int:
        return sum(self.space.units[u].size_bytes for u in list(self._fns))


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _chain(fns: Sequence[GraphFn]) -> GraphFn:
    fns = [fn for fn in fns if fn is not _identity] or [_identity]
    if len(fns) == 1:
        return fns[0]

    def run(x: np.ndarray) -> np.ndarray:
        for fn in fns:
            x = fn(x)
        return x

    return run


@dataclass(frozen=True)
class ComposedVariant:
    """What a composed runner reports as its ``variant`` (the fields serve reads of a bundled one)."""

    arch_id: str
    exit_stage: int
    latency_ms: float
    memory_mb: float
    accuracy: float
    units: tuple[Unit, ...]


class ComposedRunner(ChainRunner):
    """A :class:`ChainRunner` whose segments are chains of shared unit sessions; ``close`` releases them."""

    def __init__(self, store: BlockStore, variant: ComposedVariant, segments: Sequence[GraphFn],
                 exits: Sequence[GraphFn], notes: Sequence[str] = ()) -> None:
        super().__init__(variant, segments, exits, "onnxruntime", notes)
        self.store = store
        self._released = False

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The raw logits of the variant's own exit for ``x`` (every segment, then the last head)."""
        for segment in self._segments:
            x = segment(x)
        return self._exits[-1](x)

    def close(self) -> None:
        super().close()
        if not self._released:
            self._released = True
            self.store.release(self.variant.units)


def compose(store: BlockStore, config: Config, *, latency_ms: float = 0.0, accuracy: float = float("nan"),
            memory_mb: float | None = None) -> ComposedRunner:
    """A runner of ``config`` chaining the store's unit sessions (loaded now if missing).

    ``latency_ms``/``accuracy`` are what the caller knows of the variant (its table entry, or what
    re-search measured); ``memory_mb`` defaults to the variant's own footprint."""
    space = store.space
    units, stage_end, exits = space.units_of(config)
    missing = [u for u in [*units, *exits.values()] if u not in space.units]
    if missing:
        raise ModelError(f"variant {config.arch_id} needs units the bundle does not ship: {missing[:3]}")
    used = tuple([*units, *exits.values()])
    try:
        fns = store.acquire(used)
    except HmtError:
        raise
    except Exception as exc:
        raise ModelError(f"variant {config.arch_id}: a unit failed to load ({type(exc).__name__}: {exc})") from exc
    by_unit = dict(zip(used, fns))
    segments, heads = [], []
    begin = 0
    for s in range(config.exit_stage + 1):
        segments.append(_chain([by_unit[u] for u in units[begin:stage_end[s]]]))
        heads.append(by_unit[exits[s]])
        begin = stage_end[s]
    footprint = space.footprint_bytes(config) if memory_mb is None else int(memory_mb * 1e6)
    variant = ComposedVariant(config.arch_id, config.exit_stage, latency_ms, footprint / 1e6, accuracy, used)
    return ComposedRunner(store, variant, segments, heads,
                          [f"composed from {len(set(used))} shared block graphs ({BLOCKS_DIR}/)"])


def load_calibration(bundle: Bundle, space: BlockSpace) -> tuple[np.ndarray, np.ndarray]:
    """The bundle's labelled calibration set (x float32 model inputs, y int64 labels), verified."""
    import io

    from hmt.runtime.verified import read_verified

    if space.calibration is None:
        raise ArtifactError(f"{bundle.root / BLOCKS_SPEC_NAME}: no calibration set shipped (deploy --blocks-data)")
    data = read_verified(bundle.artifact, space.calibration)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as blob:
            x, y = np.asarray(blob["x"], dtype=np.float32), np.asarray(blob["y"], dtype=np.int64)
    except NPZ_ERRORS as exc:
        raise ArtifactError(f"{bundle.root / space.calibration}: expected an .npz with x and y ({exc})") from exc
    if y.ndim != 1 or len(x) != len(y) or not len(y):
        raise ArtifactError(f"{bundle.root / space.calibration}: x and y must hold the same non-zero count")
    return x, y


def accuracy_on(runner: ChainRunner, x: np.ndarray, y: np.ndarray, batch: int = 64) -> float:
    """Top-1 accuracy of ``runner`` at its own exit (no early exit) on (x, y), in batches."""
    correct = 0
    for start in range(0, len(x), batch):
        results = runner.run_batch(x[start:start + batch], None)
        correct += sum(int(r.class_index == int(t)) for r, t in zip(results, y[start:start + batch]))
    return correct / len(x)
