"""``deploy --verify``: is a bundle (directory or ``.tar.gz``) intact, for its target, and runnable?

Checks, in order; the first four raise at the first problem, naming the file:

1. integrity: every file the manifest lists is present with its size and sha256, and no
   file is there that it does not list (an extra file is as suspect as a changed one),
   no symlink or special file; with a trusted key, the manifest's ed25519 signature; an
   archive is extracted within a size budget and must match the bundle directory beside
   it, if there is one (a kill between the two writes must not leave a stale archive "OK");
2. contents: ``bundle.json``, ``serve.json``, ``index.json`` (the bundled variants exactly)
   and ``profile.json`` parse and validate;
3. target: a registered target, the same in ``bundle.json`` and the manifest (and the one
   asked for, if any);
4. machine: the ELF header of every compiled library names the target's CPU.

1, 3, 4 and serve.json are :func:`hmt.bundle.check_bundle`, which ``hmt serve`` runs too.

5. runs: every ``.onnx`` loads in ONNX Runtime (portable, so on any host), every ``.so``
   loads in the TVM runtime where the target's architecture is this host's, and one
   seeded input goes through each variant's chain (TVM checked against ONNX Runtime);
   a variant with BN-adaptable graphs (``deploy --adaptable``) must answer the same input
   through them, with its shipped statistics, as its fused chain does.
   Failures here are collected and raised together as a VerificationError.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hmt.artifacts.manifest import MANIFEST_NAME
from hmt.artifacts.store import sha256_file
from hmt.bundle import Bundle, BundleVariant, check_bundle, load_bundle
from hmt.compat import strict_zip
from hmt.deploy.archive import ARCHIVE_SUFFIX, extract_archive, is_archive
from hmt.deploy.targets import TARGETS, host_arch
from hmt.errors import ArtifactError, HmtError, InputError, VerificationError

ATOL = 1e-3
RTOL = 1e-3


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "skipped" or "failed"
    detail: str = ""


@dataclass
class VerifyReport:
    source: Path
    target: str
    variants: list[str]
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "failed"]

    def add(self, name: str, status: str, detail: str = "") -> None:
        self.checks.append(Check(name, status, detail))

    def summary(self) -> str:
        """One line: how many checks passed, and each skipped one with its reason."""
        skipped = [c for c in self.checks if c.status == "skipped"]
        line = f"{len(self.checks) - len(skipped)} checks ok"
        if skipped:
            line += f", {len(skipped)} skipped (" + "; ".join(f"{c.name}: {c.detail}" for c in skipped) + ")"
        return line

    def to_json_dict(self) -> dict[str, Any]:
        return {"bundle": str(self.source), "target": self.target, "variants": self.variants,
                "ok": not self.failures, "checks": [vars(c) for c in self.checks]}


@contextmanager
def opened_bundle(path: Path | str, *, trusted_key: Any | None = None) -> Iterator[Path]:
    """The bundle directory for ``path``: itself, or an archive extracted (safely) to a temporary folder;
    with ``trusted_key``, an archive's signature is checked before anything is extracted."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not path.exists():
        raise InputError(f"{path}: does not exist; expected a bundle directory (hmt deploy --out) or its .tar.gz")
    if not is_archive(path):
        kind = f"a {path.suffix} file" if path.suffix else "a file"
        raise InputError(f"{path}: is {kind}, not a bundle; expected a bundle directory (hmt deploy --out) or its "
                         ".tar.gz archive")
    with tempfile.TemporaryDirectory(prefix="hmt-verify-") as tmp:
        root = extract_archive(path, Path(tmp), trusted_key=trusted_key)
        try:
            yield root
        except HmtError as exc:
            # Name the archive the user gave, not the temporary folder it was unpacked to.
            message = str(exc).replace(str(root), f"{path}!").replace(tmp, f"{path}!")
            raise type(exc)(message) from exc


def check_archive_binding(archive: Path, root: Path) -> str | None:
    """Refuse ``OUT.tar.gz`` whose manifest is not the one of the directory ``OUT`` beside it.

    ``hmt deploy`` commits the two together, but an archive from an older hmt, or one
    copied back over, can sit beside a rebuilt directory: it is internally consistent, so
    nothing else would notice it is stale. Returns the directory compared with, or None.
    """
    if not archive.name.endswith(ARCHIVE_SUFFIX):
        return None
    sibling = archive.with_name(archive.name[: -len(ARCHIVE_SUFFIX)])
    sibling_manifest = sibling / MANIFEST_NAME
    if not sibling_manifest.is_file():
        return None
    ours, theirs = sha256_file(root / MANIFEST_NAME), sha256_file(sibling_manifest)
    if ours != theirs:
        raise ArtifactError(f"{archive}: stale: its {MANIFEST_NAME} (sha256 {ours[:16]}...) is not the one of the "
                            f"bundle directory {sibling} beside it ({theirs[:16]}...); one of them is from an "
                            "earlier or interrupted deploy: rebuild with hmt deploy, or move one away")
    return str(sibling)


def _check_contents(bundle: Bundle) -> str:
    """Refuse JSON files that do not parse or agree; returns what was checked (for the report)."""
    from hmt.pareto.index import FrontIndex
    from hmt.profile.schema import validate_profile
    from hmt.runtime.blocks import BLOCKS_SPEC_NAME, load_block_space

    root = bundle.root
    try:
        index = FrontIndex.from_json_dict(bundle.artifact.read_json("index.json"), source=str(root / "index.json"))
        validate_profile(bundle.profile(), source=str(root / "profile.json"))
    except HmtError as exc:
        raise ArtifactError(str(exc)) from exc
    indexed = sorted(e.arch_id for e in index.entries)
    bundled = sorted(v.arch_id for v in bundle.spec.variants)
    if indexed != bundled:
        raise ArtifactError(f"{root / 'index.json'}: indexes {indexed}, but bundle.json bundles {bundled}")
    checked = "bundle.json, serve.json, index.json, profile.json"
    if any(record.path == BLOCKS_SPEC_NAME for record in bundle.artifact.manifest.files):
        load_block_space(bundle)  # deploy --blocks: what serve --blocks composes from must parse (and be listed)
        checked += ", " + BLOCKS_SPEC_NAME
    return checked


def _chain(bundle: Bundle, variant: BundleVariant, x: Any, engine: str) -> list[Any]:
    """Exit logits after every segment, each graph verified and loaded by the runtime layer ``hmt serve`` uses."""
    from hmt.runtime.variant import graph_fn

    outputs = []
    features = x
    for segment, head in strict_zip(variant.segments, variant.exits):
        features = graph_fn(bundle, segment, engine, threads=0)(features)
        outputs.append(graph_fn(bundle, head, engine, threads=0)(features))
    return outputs


def _check_runs(bundle: Bundle, target: str, report: VerifyReport, seed: int) -> None:
    import importlib.util

    import numpy as np

    rng = np.random.default_rng(seed)
    spec = bundle.spec.input
    x = rng.standard_normal(spec.shape).astype(spec.dtype)
    same_arch = TARGETS[target].arch == host_arch()
    have_tvm = importlib.util.find_spec("tvm") is not None
    for variant in bundle.spec.variants:
        name = f"run {variant.arch_id}"
        try:
            reference = _chain(bundle, variant, x, "onnxruntime")
        except Exception as exc:  # noqa: BLE001 - any runtime failure is a verification result
            report.add(f"{name} [onnxruntime]", "failed", f"{type(exc).__name__}: {exc}")
            continue
        bad = [k for k, out in enumerate(reference)
               if out.shape[-1] != bundle.spec.classes or not np.all(np.isfinite(out))]
        if bad:
            report.add(f"{name} [onnxruntime]", "failed", f"exit(s) {bad} give non-finite logits or a wrong shape")
            continue
        report.add(f"{name} [onnxruntime]", "ok", f"{len(reference)} exit(s), seeded input (seed {seed})")
        if variant.extra.get("adaptable") is not None:
            from hmt.deploy.adaptable import check_adaptable

            try:
                ok, detail = check_adaptable(bundle, variant, x, reference)
            except Exception as exc:  # noqa: BLE001 - any load or runtime failure is a verification result
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            report.add(f"adaptable {variant.arch_id}", "ok" if ok else "failed", detail)
        if "tvm" not in variant.engines:
            continue
        if not same_arch:
            report.add(f"{name} [tvm]", "skipped", f"libraries are for {TARGETS[target].arch}; this host is "
                       f"{host_arch()} (checked by ELF header only)")
            continue
        if not have_tvm:
            report.add(f"{name} [tvm]", "skipped", "the TVM runtime is not installed here")
            continue
        try:
            outputs = _chain(bundle, variant, x, "tvm")
        except Exception as exc:  # noqa: BLE001 - any runtime failure is a verification result
            report.add(f"{name} [tvm]", "failed", f"{type(exc).__name__}: {exc}")
            continue
        errors = [float(np.max(np.abs(a - b))) for a, b in strict_zip(reference, outputs)]
        ok = all(np.allclose(a, b, atol=ATOL, rtol=RTOL) for a, b in strict_zip(reference, outputs))
        report.add(f"{name} [tvm]", "ok" if ok else "failed",
                   f"max |tvm - onnxruntime| {max(errors):.2e} over {len(errors)} exit(s) (atol {ATOL})")


def verify_bundle(path: Path | str, *, expected_target: str | None = None, run_models: bool = True,
                  seed: int = 0, trusted_key: Any | None = None) -> VerifyReport:
    """Verify a bundle directory or archive; raises on the first integrity problem, or with
    every runtime failure at the end. Returns the report of what was checked.

    ``trusted_key`` (a loaded ed25519 public key, :func:`hmt.artifacts.signing.load_public_key`)
    makes a missing or non-matching signature a failure."""
    path = Path(path)
    with opened_bundle(path, trusted_key=trusted_key) as root:
        bound_to = check_archive_binding(path, root) if root != path else None
        bundle = load_bundle(root)
        report = VerifyReport(path, "", [v.arch_id for v in bundle.spec.variants])
        checks = check_bundle(bundle, expected_target=expected_target, trusted_key=trusted_key)
        report.add("checksums", "ok", f"{checks.files} files match {MANIFEST_NAME}; no extra or missing files, "
                   "no symlinks")
        signature = {"ok": ("ok", f"ed25519, trusted key {str(checks.signature.key_sha256)[:16]}..."),
                     "unchecked": ("skipped", "signed, but no --trusted-key to check it against"),
                     "absent": ("skipped", "not signed")}[checks.signature.status]
        report.add("signature", *signature)
        if root != path:
            report.add("archive", "ok" if bound_to else "skipped",
                       f"same manifest as {bound_to}" if bound_to else "no bundle directory beside it to compare")
        report.add("contents", "ok", f"{_check_contents(bundle)} parse and agree")
        report.target = checks.target
        report.add("target", "ok", report.target)
        report.add("elf machine", "ok" if checks.libraries else "skipped",
                   f"{checks.libraries} libraries for {checks.elf_machine}" if checks.libraries
                   else "no compiled libraries in the bundle")
        if run_models:
            _check_runs(bundle, report.target, report, seed)
    if report.failures:
        detail = "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
        raise VerificationError(f"{path}: {len(report.failures)} check(s) failed: {detail}")
    return report
