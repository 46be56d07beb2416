"""serve and verify run the same structural checks; optional ed25519 signatures; bad values exit 4 in both.

The tampering here rewrites the manifest's record of the changed file, as an attacker
would: the checksums then pass, and only the structural checks (or a signature) stand.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import commands.deploy  # noqa: F401 - registers the command
from commands.app import app
from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.artifacts.checks import check_exact_files
from hmt.artifacts.manifest import content_digest
from hmt.artifacts.signing import (
    SIGNATURE_NAME,
    generate_key_pair,
    load_private_key,
    load_public_key,
    sign_artifact_dir,
)
from hmt.bundle import load_checked_bundle
from hmt.deploy import verify_bundle
from hmt.deploy.archive import archive_path_for
from hmt.errors import ArtifactError, InputError, UnsafePathError

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _reseal(root: Path, rel: str) -> None:
    """Rewrite the manifest's record of ``rel`` to match the file as it is now (or add one)."""
    manifest_path = root / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = (root / rel).read_bytes()
    record = {"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data),
              "media_type": "application/octet-stream"}
    manifest["files"] = [f for f in manifest["files"] if f["path"] != rel] + [record]
    manifest["content_sha256"] = content_digest(manifest)
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _serve(bundle: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``hmt serve`` in its own process (a check that wrongly passes would serve: the timeout ends it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "commands", "serve", str(bundle), "--port", "0", *extra],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def _keys(tmp_path: Path, name: str = "key.pem") -> tuple[Path, Path]:
    return generate_key_pair(tmp_path / "keys" / name)


def _sign(bundle: Path, private: Path) -> None:
    sign_artifact_dir(bundle, load_artifact(bundle, kind="bundle").manifest_sha256, load_private_key(private))


def _lib(bundle: Path) -> Path:
    return next(bundle.rglob("*.so"))


# -- the same structural checks in serve as in verify -------------------------------------------------------

def test_serve_refuses_an_extra_shared_library(bundle_copy: Path) -> None:
    shutil.copyfile(_lib(bundle_copy), bundle_copy / "variants" / "libextra.so")
    with pytest.raises(ArtifactError, match=r"1 file\(s\) not in manifest.json: variants/libextra.so"):
        load_checked_bundle(bundle_copy)
    done = _serve(bundle_copy)
    assert done.returncode == ArtifactError.exit_code, done.stderr[-2000:]
    assert "variants/libextra.so" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("where", ["variants/etc", "variants/x/link.so"])
def test_serve_refuses_a_symlink(bundle_copy: Path, where: str) -> None:
    link = bundle_copy / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("/etc" if where.endswith("etc") else _lib(bundle_copy))
    with pytest.raises(UnsafePathError, match="a symlink"):
        load_checked_bundle(bundle_copy)
    with pytest.raises(UnsafePathError, match="a symlink"):
        verify_bundle(bundle_copy, run_models=False)
    if where.endswith("etc"):  # one end-to-end run of serve is enough (a process start costs ~1.5 s)
        done = _serve(bundle_copy)
        assert done.returncode == ArtifactError.exit_code and "symlink" in done.stderr, done.stderr[-2000:]


def test_serve_refuses_a_library_for_another_machine(bundle_copy: Path) -> None:
    library = _lib(bundle_copy)
    data = bytearray(library.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64 in an x86-64 bundle
    library.write_bytes(bytes(data))
    _reseal(bundle_copy, library.relative_to(bundle_copy).as_posix())
    with pytest.raises(ArtifactError, match="ELF for aarch64 .* target x86-64 needs x86_64"):
        load_checked_bundle(bundle_copy)


def test_a_fifo_in_the_bundle_is_refused(bundle_copy: Path) -> None:
    os.mkfifo(bundle_copy / "variants" / "pipe")
    with pytest.raises(UnsafePathError, match="FIFO"):
        load_checked_bundle(bundle_copy)


# -- signatures ---------------------------------------------------------------------------------------------

def test_a_good_signature_is_accepted_by_verify_and_serve(bundle_copy: Path, tmp_path: Path) -> None:
    private, public = _keys(tmp_path)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    _sign(bundle_copy, private)
    load_checked_bundle(bundle_copy, trusted_key=public)
    report = verify_bundle(bundle_copy, run_models=False, trusted_key=load_public_key(public))
    assert {c.name: c.status for c in report.checks}["signature"] == "ok"
    # Without a trusted key the signature is reported, not checked.
    report = verify_bundle(bundle_copy, run_models=False)
    assert {c.name: c.status for c in report.checks}["signature"] == "skipped"


def test_a_signature_by_another_key_is_refused(bundle_copy: Path, tmp_path: Path) -> None:
    private, _ = _keys(tmp_path, "attacker.pem")
    _, trusted = _keys(tmp_path, "ours.pem")
    _sign(bundle_copy, private)
    with pytest.raises(ArtifactError, match="not by the trusted key"):
        load_checked_bundle(bundle_copy, trusted_key=trusted)
    done = _serve(bundle_copy, "--trusted-key", str(trusted))
    assert done.returncode == ArtifactError.exit_code and "not by the trusted key" in done.stderr, done.stderr


def test_a_changed_manifest_breaks_the_signature(bundle_copy: Path, tmp_path: Path) -> None:
    private, public = _keys(tmp_path)
    _sign(bundle_copy, private)
    library = _lib(bundle_copy)
    library.write_bytes(library.read_bytes() + b"\x90")
    _reseal(bundle_copy, library.relative_to(bundle_copy).as_posix())  # checksums pass again
    with pytest.raises(ArtifactError, match="the signature does not match manifest.json"):
        load_checked_bundle(bundle_copy, trusted_key=public)


def test_a_missing_or_malformed_signature_is_refused_when_a_key_is_trusted(bundle_copy: Path,
                                                                         tmp_path: Path) -> None:
    _, public = _keys(tmp_path)
    with pytest.raises(ArtifactError, match="manifest.sig: missing; a trusted key was given"):
        load_checked_bundle(bundle_copy, trusted_key=public)
    (bundle_copy / SIGNATURE_NAME).write_text("not json")
    with pytest.raises(ArtifactError, match="malformed signature file"):
        load_checked_bundle(bundle_copy, trusted_key=public)


def test_key_files_are_checked(tmp_path: Path) -> None:
    (tmp_path / "rsa.txt").write_text("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    with pytest.raises(InputError, match="rsa.txt: not a PEM public key"):
        load_public_key(tmp_path / "rsa.txt")
    with pytest.raises(InputError, match="does not exist; expected a public key file; create one with"):
        load_public_key(tmp_path / "absent.pub")
    private, _ = _keys(tmp_path)
    with pytest.raises(InputError, match="already exists; hmt never overwrites it"):
        generate_key_pair(private)


def test_openssl_keys_work(bundle_copy: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, timeout=30)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, timeout=30)
    _sign(bundle_copy, key)
    load_checked_bundle(bundle_copy, trusted_key=pub)


def test_deploy_signs_and_verify_checks_through_the_cli(fused_dir: Path, pareto_dir: Path, tmp_path: Path) -> None:
    key = tmp_path / "keys" / "sign.pem"
    result = runner.invoke(app, ["deploy", "--gen-key", str(key), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["public_key"] == f"{key}.pub"
    out = tmp_path / "signed"
    result = runner.invoke(app, ["deploy", "--fused", str(fused_dir), "--pareto", str(pareto_dir), "--target",
                                 "x86-64", "--engine", "onnxruntime", "--sign-key", str(key), "--out", str(out),
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {c["name"]: c["status"] for c in doc["verify"]["checks"]}["signature"] == "ok"
    result = runner.invoke(app, ["deploy", "--verify", str(archive_path_for(out)), "--trusted-key", f"{key}.pub",
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}["signature"] == "ok"
    other = tmp_path / "keys" / "other.pem"
    generate_key_pair(other)
    result = runner.invoke(app, ["deploy", "--verify", str(archive_path_for(out)), "--trusted-key", f"{other}.pub"])
    assert result.exit_code == ArtifactError.exit_code and "not by the trusted key" in result.output


# -- item 10: the same exit code for the same bad value, bounded messages ----------------------------------

def _verify_and_serve_with_latency_budget(bundle: Path, value: object) -> tuple[str, str]:
    """serve.json's budgets.latency_ms set to ``value`` (resealed); both deploy --verify and serve exit 4.
    Returns their outputs."""
    config = json.loads((bundle / "serve.json").read_text())
    config["budgets"]["latency_ms"] = value
    (bundle / "serve.json").write_text(json.dumps(config))
    _reseal(bundle, "serve.json")
    verified = runner.invoke(app, ["deploy", "--verify", str(bundle)])
    served = _serve(bundle)
    assert verified.exit_code == served.returncode == ArtifactError.exit_code, (verified.output, served.stderr)
    return verified.output, served.stderr


def test_a_bad_serve_json_value_exits_4_in_serve_and_in_verify(bundle_copy: Path) -> None:
    for text in _verify_and_serve_with_latency_budget(bundle_copy, -5):
        assert "serve.json" in text and "budgets.latency_ms must be a number >= 0.001" in text


def test_a_serve_json_value_of_the_wrong_type_exits_4_naming_the_key(bundle_copy: Path) -> None:
    # A string where a number belongs reached a comparison and came out as Python's own TypeError
    # ("'>' not supported between instances of 'str' and 'int'"), naming no key.
    for text in _verify_and_serve_with_latency_budget(bundle_copy, "fast"):
        assert "serve.json: budgets: latency_ms must be a finite number or null, got 'fast'" in text
        assert "Traceback" not in text and "not supported" not in text


def test_a_huge_input_shape_is_an_artifact_error(bundle_copy: Path) -> None:
    spec = json.loads((bundle_copy / "bundle.json").read_text())
    spec["input"]["shape"] = [1, 3, 100_000, 100_000]
    (bundle_copy / "bundle.json").write_text(json.dumps(spec))
    _reseal(bundle_copy, "bundle.json")
    result = runner.invoke(app, ["deploy", "--verify", str(bundle_copy)])
    assert result.exit_code == ArtifactError.exit_code, result.output
    assert "3e+10 elements" in result.output and "internal error" not in result.output


def _spill(tmp_path: Path, count: int) -> Path:
    out = tmp_path / "art"
    with ArtifactWriter(out, kind="demo", config={}) as writer:
        writer.write_bytes("data.bin", b"x")
    spill = out / "spill"
    spill.mkdir()
    for i in range(count):
        (spill / f"f{i:05d}.so").touch()
    return out


@pytest.mark.parametrize("count", [
    200,
    pytest.param(50_000, marks=pytest.mark.slow),  # the case; ~13 s on 2 shared cores
])
def test_many_extra_files_give_a_bounded_message(tmp_path: Path, count: int) -> None:
    out = _spill(tmp_path, count)
    with pytest.raises(ArtifactError) as caught:
        check_exact_files(load_artifact(out, kind="demo"))
    message = str(caught.value)
    assert len(message) < 1000, len(message)
    assert f"{count:,} file(s) not in manifest.json: spill/f00000.so" in message
    assert f"and {count - 10:,} more" in message
