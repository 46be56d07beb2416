"""The deploy bundle's layout: written by ``hmt deploy``, read by ``hmt serve`` (no torch).

A bundle is an artifact directory of kind ``bundle``::

    bundle.json            what is inside (this module's :class:`BundleSpec`)
    profile.json           the device profile the variants were predicted for
    index.json             the pareto runtime index, restricted to the bundled variants
    serve.json             the serve config (budgets, optimizer and switch settings, early exit)
    variants/<arch_id>/    segment_<k>.onnx, exit_<k>.onnx (+ .so compiled for the target)

and ``manifest.json`` with the sha256 of every file. Each variant runs as a chain: the
input goes through ``segment_0 .. segment_i``, and ``exit_i`` reads segment ``i``'s output;
serve may stop after any segment whose exit is confident enough. Every path in
``bundle.json`` is relative to the bundle and must stay inside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hmt.artifacts import Artifact, load_artifact, safe_join
from hmt.artifacts.checks import check_exact_files
from hmt.artifacts.signing import SIGNATURE_NAME, SignatureCheck, check_signature
from hmt.compat import strict_zip
from hmt.errors import ArtifactError, HmtError, UsageError

BUNDLE_KIND = "bundle"
BUNDLE_SPEC_NAME = "bundle.json"
BUNDLE_SPEC_VERSION = 1
PROFILE_NAME = "profile.json"
INDEX_NAME = "index.json"
ENERGY_UNIT = "mJ"  # the unit of an energy budget (per inference); calibrated fronts' energies are in it
SERVE_CONFIG_NAME = "serve.json"
VARIANTS_DIR = "variants"
ENGINES = ("onnxruntime", "tvm")
# What a tensor in bundle.json may be: the dtypes serve's runner knows, and at most this
# many elements (512 MB of float32), so a hostile shape is an artifact error at load time
# rather than a failed allocation later.
TENSOR_DTYPES = ("float32", "float16", "float64", "int64", "int32", "uint8", "int8")
MAX_TENSOR_ELEMENTS = 1 << 27


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> TensorSpec:
        try:
            shape = data["shape"]
            if not isinstance(shape, (list, tuple)) or not all(type(d) is int for d in shape):
                raise TypeError(f"shape must be a list of integers, got {str(shape)[:80]}")
            spec = cls(str(data["name"]), tuple(shape), str(data["dtype"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: expected {{name, shape, dtype}} ({exc})") from exc
        spec._check(where)
        return spec

    def _check(self, where: str) -> None:
        if self.dtype not in TENSOR_DTYPES:
            raise ArtifactError(f"{where}: dtype {self.dtype[:40]!r} is not one of {list(TENSOR_DTYPES)}")
        if not 1 <= len(self.shape) <= 8 or any(d < 1 for d in self.shape):
            raise ArtifactError(f"{where}: shape {list(self.shape)[:10]} needs 1 to 8 dimensions, each >= 1")
        elements = math.prod(self.shape)
        if elements > MAX_TENSOR_ELEMENTS:
            raise ArtifactError(f"{where}: shape {list(self.shape)} has {elements:.3g} elements, more than "
                                f"{MAX_TENSOR_ELEMENTS} a bundle tensor may have")


@dataclass(frozen=True)
class GraphSpec:
    """One static graph of a variant's chain (a segment or an exit head).

    ``onnx`` is always present (ONNX Runtime can run it anywhere); ``tvm`` is the shared
    library compiled for the bundle's target, or None when none was built for it.
    ``consumes_segment`` is the segment whose output an exit head reads (None for segments).
    """

    index: int
    input: TensorSpec
    output: TensorSpec
    onnx: str
    tvm: str | None = None
    consumes_segment: int | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> GraphSpec:
        try:
            tvm = data.get("tvm")
            consumes = data.get("consumes_segment")
            return cls(
                index=int(data["index"]),
                input=TensorSpec.from_mapping(data["input"], f"{where}.input"),
                output=TensorSpec.from_mapping(data["output"], f"{where}.output"),
                onnx=str(data["onnx"]),
                tvm=None if tvm is None else str(tvm),
                consumes_segment=None if consumes is None else int(consumes),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed graph entry ({exc})") from exc


@dataclass(frozen=True)
class BundleVariant:
    """One Pareto variant as bundled: its chain of graphs and what pareto measured/predicted.

    ``latency_ms``/``energy``/``memory_mb`` are the predictions for the bundle's profile at
    the variant's own exit (``exit_stage``); ``accuracy_per_exit[k]`` is the measured accuracy
    when stopping after segment ``k``. ``preferred_engine`` is what fuse measured fastest
    (or the only engine available on the target).
    """

    arch_id: str
    exit_stage: int
    accuracy: float
    accuracy_per_exit: tuple[float, ...]
    latency_ms: float
    energy: float
    memory_mb: float
    segments: tuple[GraphSpec, ...]
    exits: tuple[GraphSpec, ...]
    preferred_engine: str
    engines: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> BundleVariant:
        try:
            segments = tuple(
                GraphSpec.from_mapping(s, f"{where}.segments[{i}]") for i, s in enumerate(data["segments"])
            )
            exits = tuple(GraphSpec.from_mapping(s, f"{where}.exits[{i}]") for i, s in enumerate(data["exits"]))
            variant = cls(
                arch_id=str(data["arch_id"]),
                exit_stage=int(data["exit_stage"]),
                accuracy=float(data["accuracy"]),
                accuracy_per_exit=tuple(float(a) for a in data["accuracy_per_exit"]),
                latency_ms=float(data["latency_ms"]),
                energy=float(data["energy"]),
                memory_mb=float(data["memory_mb"]),
                segments=segments,
                exits=exits,
                preferred_engine=str(data["preferred_engine"]),
                engines=tuple(str(e) for e in data["engines"]),
                extra=dict(data.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed variant entry ({exc})") from exc
        variant._check(where)
        return variant

    def _check(self, where: str) -> None:
        if not self.segments or len(self.exits) != len(self.segments):
            raise ArtifactError(f"{where}: needs one exit head per segment (segments {len(self.segments)}, "
                                f"exits {len(self.exits)})")
        if not 0 <= self.exit_stage < len(self.segments):
            raise ArtifactError(f"{where}: exit_stage {self.exit_stage} outside 0..{len(self.segments) - 1}")
        for k, (segment, head) in enumerate(strict_zip(self.segments, self.exits)):
            if segment.index != k or head.index != k or head.consumes_segment != k:
                raise ArtifactError(f"{where}: graph {k} is out of order")
            if k and segment.input.name != self.segments[k - 1].output.name:
                raise ArtifactError(f"{where}: segment {k} reads {segment.input.name!r}, "
                                    f"segment {k - 1} writes {self.segments[k - 1].output.name!r}")
        unknown = [e for e in (*self.engines, self.preferred_engine) if e not in ENGINES]
        if unknown:
            raise ArtifactError(f"{where}: unknown engine(s) {unknown}; expected some of {list(ENGINES)}")
        if self.preferred_engine not in self.engines:
            raise ArtifactError(f"{where}: preferred_engine {self.preferred_engine!r} not in engines")
        if "tvm" in self.engines and any(g.tvm is None for g in (*self.segments, *self.exits)):
            raise ArtifactError(f"{where}: lists engine 'tvm' but a graph has no compiled library")

    def graphs(self) -> tuple[GraphSpec, ...]:
        return (*self.segments, *self.exits)

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


# CIFAR-10's normalisation (the ImageNet constants the shipped CIFAR ResNets were trained
# with, hmt.data.cifar): what serve assumes for an image bundle that does not say.
DEFAULT_MEAN: tuple[float, ...] = (0.485, 0.456, 0.406)
DEFAULT_STD: tuple[float, ...] = (0.229, 0.224, 0.225)
LAYOUTS = ("NCHW", "NHWC", "NCL")
SEQUENCE_LAYOUT = "NCL"  # a sequence (time series, audio features): channels, then length


@dataclass(frozen=True)
class Preprocess:
    """How raw pixels become the input tensor: ``x = (pixel / pixel_scale - mean) / std`` per
    channel, in ``layout``; the input size is the input spec's shape. Optional in
    ``bundle.json`` (older bundles): serve then assumes these defaults (CIFAR-10's) for an image.
    A sequence input (layout ``NCL``, ``pixel_scale`` 1) records its standardization the same way:
    ``x = (raw - mean) / std`` per channel, as the supernet was trained."""

    mean: tuple[float, ...] = DEFAULT_MEAN
    std: tuple[float, ...] = DEFAULT_STD
    layout: str = "NCHW"
    pixel_scale: float = 255.0

    @classmethod
    def from_mapping(cls, data: Any, where: str) -> Preprocess:
        if not isinstance(data, Mapping):
            raise ArtifactError(f"{where}: expected an object {{mean, std, layout, pixel_scale}}")
        try:
            pre = cls(mean=tuple(float(v) for v in data.get("mean", DEFAULT_MEAN)),
                      std=tuple(float(v) for v in data.get("std", DEFAULT_STD)),
                      layout=str(data.get("layout", "NCHW")), pixel_scale=float(data.get("pixel_scale", 255.0)))
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed ({exc})") from exc
        if pre.layout not in LAYOUTS or len(pre.mean) != len(pre.std) or not pre.mean:
            raise ArtifactError(f"{where}: needs layout in {list(LAYOUTS)} and one mean and std per channel")
        if not all(s > 0 for s in pre.std) or not pre.pixel_scale > 0:
            raise ArtifactError(f"{where}: std and pixel_scale must be > 0")
        return pre


@dataclass(frozen=True)
class BundleSpec:
    """``bundle.json``: the target (a snapshot of its registry entry) and the variants."""

    target: dict[str, Any]
    input: TensorSpec
    classes: int
    variants: tuple[BundleVariant, ...]
    notes: tuple[str, ...] = ()
    version: int = BUNDLE_SPEC_VERSION
    # Optional (absent from older bundles): the input's preprocessing and the class names.
    preprocess: Preprocess | None = None
    class_names: tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, data: Any, where: str = BUNDLE_SPEC_NAME) -> BundleSpec:
        if not isinstance(data, Mapping):
            raise ArtifactError(f"{where}: expected a JSON object")
        if data.get("version") != BUNDLE_SPEC_VERSION:
            raise ArtifactError(f"{where}: version {data.get('version')!r}; this hmt reads {BUNDLE_SPEC_VERSION}")
        try:
            variants = tuple(
                BundleVariant.from_mapping(v, f"{where}: variants[{i}]") for i, v in enumerate(data["variants"])
            )
            spec = cls(
                target=dict(data["target"]),
                input=TensorSpec.from_mapping(data["input"], f"{where}: input"),
                classes=int(data["classes"]),
                variants=variants,
                notes=tuple(str(n) for n in data.get("notes", ())),
                preprocess=None if data.get("preprocess") is None else Preprocess.from_mapping(
                    data["preprocess"], f"{where}: preprocess"),
                class_names=None if data.get("class_names") is None else tuple(
                    str(n) for n in data["class_names"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed ({exc})") from exc
        if spec.class_names is not None and len(spec.class_names) != spec.classes:
            raise ArtifactError(f"{where}: {len(spec.class_names)} class_names for {spec.classes} classes")
        if not variants:
            raise ArtifactError(f"{where}: lists no variants")
        ids = [v.arch_id for v in variants]
        if len(set(ids)) != len(ids):
            raise ArtifactError(f"{where}: a variant is listed twice")
        return spec

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["variants"] = [v.to_json_dict() for v in self.variants]
        return data

    def variant(self, arch_id: str) -> BundleVariant:
        for candidate in self.variants:
            if candidate.arch_id == arch_id:
                return candidate
        bundled = [v.arch_id for v in self.variants]
        raise ArtifactError(f"{BUNDLE_SPEC_NAME}: no variant {arch_id!r}; bundled: {bundled}")


@dataclass(frozen=True)
class Bundle:
    """A loaded, checksum-verified bundle."""

    artifact: Artifact
    spec: BundleSpec
    serve_config: dict[str, Any]

    @property
    def root(self) -> Path:
        return self.artifact.root

    def path(self, relative: str) -> Path:
        """A file the bundle lists, checked to stay inside the bundle."""
        return self.artifact.file(relative)

    def profile(self) -> dict[str, Any]:
        data: dict[str, Any] = self.artifact.read_json(PROFILE_NAME)
        return data

    def index_path(self) -> Path:
        return self.path(INDEX_NAME)

    def energy_unit(self) -> str:
        """The unit of the variants' ``energy``: the front's (``index.json`` ``units.energy``),
        else what the bundled profile's energy model is in (mJ only when calibrated)."""
        index = self.artifact.read_json(INDEX_NAME)
        units = index.get("units") if isinstance(index, dict) else None
        if isinstance(units, dict) and isinstance(units.get("energy"), str):
            return str(units["energy"])
        model = (self.profile().get("models") or {}).get("energy") or {}
        return "mJ" if model.get("calibrated") else str(model.get("unit", "mac_equivalent"))

    def check_energy_budget(self, energy_mj: float | None, *, what: str = "budgets.energy") -> None:
        """Refuse an energy budget the variants' energies cannot be held to: a budget is in mJ per
        inference, and an uncalibrated front's energies are relative (MAC-equivalents), not joules."""
        if energy_mj is None:
            return
        unit = self.energy_unit()
        if unit != ENERGY_UNIT:
            raise UsageError(
                f"{what} = {energy_mj:g} mJ, but this bundle's variant energies are in {unit} (its profile's "
                "energy model is uncalibrated): an energy budget needs a profile calibrated with a power source "
                "(hmt profile-device --power ...), then pareto and deploy from it; or drop the energy budget"
            )


def variant_dir(arch_id: str) -> str:
    return f"{VARIANTS_DIR}/{arch_id}"


def load_bundle(path: Path | str, *, verify_checksums: bool = True) -> Bundle:
    """Load ``path`` as a bundle: manifest checksums, then ``bundle.json`` and its references."""
    artifact = load_artifact(path, kind=BUNDLE_KIND, verify_checksums=verify_checksums)
    spec = BundleSpec.from_mapping(artifact.read_json(BUNDLE_SPEC_NAME), str(artifact.root / BUNDLE_SPEC_NAME))
    for variant in spec.variants:
        for graph in variant.graphs():
            for relative in (graph.onnx, graph.tvm):
                if relative is not None:
                    safe_join(artifact.root, relative, what=f"{BUNDLE_SPEC_NAME} entry")
                    artifact.file(relative)
        adaptable = variant.extra.get("adaptable")
        if adaptable is not None:
            # deploy --adaptable's BN graphs (hmt.deploy.adaptable): bn.json must be a listed file;
            # the graphs it names are checked against the manifest when serve --adapt opens them.
            folder = adaptable.get("dir") if isinstance(adaptable, dict) else None
            if not isinstance(folder, str):
                raise ArtifactError(f"{artifact.root / BUNDLE_SPEC_NAME}: variant {variant.arch_id}: "
                                    "extra.adaptable needs a 'dir'")
            artifact.file(f"{folder}/bn.json")
    serve_config = artifact.read_json(SERVE_CONFIG_NAME)
    if not isinstance(serve_config, dict):
        raise ArtifactError(f"{artifact.root / SERVE_CONFIG_NAME}: expected a JSON object")
    for name in (PROFILE_NAME, INDEX_NAME):
        artifact.file(name)
    return Bundle(artifact, spec, serve_config)


@dataclass(frozen=True)
class BundleChecks:
    """What :func:`check_bundle` found: listed files, the target, compiled libraries, signature."""

    files: int
    target: str
    elf_machine: str | None
    libraries: int
    signature: SignatureCheck


def _check_serve_config(bundle: Bundle) -> None:
    from hmt.runtime.settings import ServeSettings

    where = str(bundle.root / SERVE_CONFIG_NAME)
    try:
        ServeSettings.from_mapping(bundle.serve_config, where=where)
    except ArtifactError:
        raise
    except HmtError as exc:
        # A bad value inside the bundle is a bundle that fails verification, whichever
        # command reads it (serve and deploy --verify both exit 4 for it).
        msg = str(exc)
        raise ArtifactError(msg if where in msg else f"{where}: {msg}") from exc


def _check_target(bundle: Bundle, expected: str | None, require_known: bool) -> tuple[str, str | None]:
    from hmt.deploy.targets import TARGETS

    name = str(bundle.spec.target.get("name"))
    where = bundle.root / BUNDLE_SPEC_NAME
    if expected is not None and expected != name:
        raise ArtifactError(f"{bundle.root}: built for target {name!r}, expected {expected!r}")
    if name not in TARGETS:
        if require_known:
            raise ArtifactError(f"{where}: target {name[:80]!r} is not a known target ({', '.join(TARGETS)})")
        # A target this hmt does not know (a newer hmt's, or a hand-made bundle): the
        # ELF machine recorded in bundle.json is all there is to check libraries against.
        machine = bundle.spec.target.get("elf_machine")
        return name, machine if isinstance(machine, str) else None
    configured = bundle.artifact.manifest.config.get("target")
    if configured != name:
        raise ArtifactError(f"{where}: target {name!r}, but manifest.json says {configured!r}")
    if bundle.spec.target.get("arch") != TARGETS[name].arch:
        raise ArtifactError(f"{where}: target {name} arch {bundle.spec.target.get('arch')!r}, "
                            f"the registry says {TARGETS[name].arch!r}")
    return name, TARGETS[name].elf_machine


def _check_machines(bundle: Bundle, target: str, expected: str | None) -> int:
    from hmt.deploy.elf import read_elf_header
    from hmt.deploy.targets import TARGETS

    count = 0
    for variant in bundle.spec.variants:
        for graph in variant.graphs():
            if graph.tvm is None:
                continue
            if target in TARGETS and not TARGETS[target].runs_tvm:
                raise ArtifactError(f"{bundle.root / graph.tvm}: a TVM library in a bundle for {target}, whose "
                                    f"device cannot load it ({TARGETS[target].no_tvm_reason}); rebuild the "
                                    "bundle with hmt deploy")
            if expected is None:
                raise ArtifactError(f"{bundle.root / BUNDLE_SPEC_NAME}: target {target[:80]!r} is not a known "
                                    "target and names no elf_machine; its compiled libraries cannot be checked")
            header = read_elf_header(bundle.path(graph.tvm))
            if header.machine != expected or header.bits != 64:
                raise ArtifactError(f"{bundle.root / graph.tvm}: ELF for {header.machine} ({header.bits}-bit), "
                                    f"target {target} needs {expected} (64-bit)")
            count += 1
    return count


def check_bundle(bundle: Bundle, *, expected_target: str | None = None, trusted_key: Any | None = None,
                 require_known_target: bool = True) -> BundleChecks:
    """The structural checks both ``deploy --verify`` and ``serve`` run on a loaded bundle.

    Refuses (ArtifactError, exit 4): unlisted files, symlinks or special files anywhere in
    the bundle, a ``serve.json`` that does not validate, an unknown or inconsistent target
    (or not ``expected_target``), a compiled library whose ELF header names another
    machine or whose target's device has no TVM runtime to load it, and, when ``trusted_key``
    (a loaded ed25519 public key) is given, a missing or non-matching signature.
    ``require_known_target=False`` (serve) accepts a target this hmt's registry does not
    know, checking libraries against the ELF machine bundle.json records (and refusing
    libraries when it records none).
    """
    # The signature first: with a trusted key, nothing else is looked at in a bundle from someone else.
    signature = check_signature(bundle.root, bundle.artifact.manifest_sha256, trusted_key)
    files = check_exact_files(bundle.artifact, allowed=(SIGNATURE_NAME,))
    _check_serve_config(bundle)
    target, machine = _check_target(bundle, expected_target, require_known_target)
    libraries = _check_machines(bundle, target, machine)
    return BundleChecks(files, target, machine, libraries, signature)


def load_checked_bundle(path: Path | str, *, trusted_key: Path | str | None = None,
                        rollback: Any | None = None) -> Bundle:
    """:func:`load_bundle` then :func:`check_bundle`, as ``hmt serve`` opens a bundle at start-up.

    ``trusted_key`` is a PEM ed25519 public key file: the bundle must carry a signature by it.
    ``rollback`` (a :class:`hmt.artifacts.rollback.RollbackPolicy`): with a trusted key, refuse
    a release older than the newest this key had accepted, and record this one.
    """
    from hmt.artifacts.signing import load_public_key

    key = load_public_key(trusted_key) if trusted_key is not None else None  # a bad key file fails first
    bundle = load_bundle(path)
    checks = check_bundle(bundle, trusted_key=key, require_known_target=False)
    if rollback is not None:
        from hmt.artifacts.rollback import check_and_record

        check_and_record(checks.signature, bundle.artifact.manifest_sha256, str(bundle.root), rollback)
    return bundle


# platform.machine() spellings of the CPU architectures targets name (``Target.arch``).
_MACHINE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


def foreign_machine_note(bundle: Bundle, machine: str) -> str | None:
    """A note when ``bundle`` was built for another CPU architecture than ``machine``
    (``platform.machine()``); None when they agree or the bundle names none.

    Serving it is allowed (its ONNX graphs are portable and its libraries are never loaded
    here), but its profile, thread count and latency priors describe the target, not this machine.
    """
    arch = bundle.spec.target.get("arch")
    here = _MACHINE_ALIASES.get(machine.lower(), machine.lower())
    if not isinstance(arch, str) or not here or arch.lower() == here:
        return None
    name = str(bundle.spec.target.get("name", "?"))[:80]
    return (f"{bundle.root} was built for {name} ({arch[:40]}) and this machine is {here[:40]}: its ONNX graphs run "
            f"here under ONNX Runtime, but its profile, thread count and latency predictions are {name}'s, "
            "not this machine's")


def graph_names(variants: Sequence[BundleVariant]) -> list[str]:
    """Every graph file the variants reference (for builders checking completeness)."""
    names: list[str] = []
    for variant in variants:
        for graph in variant.graphs():
            names.append(graph.onnx)
            if graph.tvm is not None:
                names.append(graph.tvm)
    return names
