"""A signature binds a release (version, creation time); serve refuses a roll-back below what it served."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hmt.artifacts import load_artifact
from hmt.artifacts.rollback import STATE_NAME, RollbackPolicy, default_state_dir
from hmt.artifacts.signing import (
    SIGNATURE_NAME,
    generate_key_pair,
    load_private_key,
    load_public_key,
    public_key_id,
    sign_artifact_dir,
)
from hmt.bundle import load_checked_bundle
from hmt.errors import ArtifactError

REPO = Path(__file__).resolve().parents[2]
OLD = "2026-01-01T00:00:00+00:00"
NEW = "2026-06-01T00:00:00+00:00"


def _sign(bundle: Path, private: Path, version: int, created: str) -> None:
    sha = load_artifact(bundle, kind="bundle").manifest_sha256
    sign_artifact_dir(bundle, sha, load_private_key(private), version=version, created_utc=created)


def _sign_first_format(bundle: Path, private: Path) -> None:
    """A signature as hmt wrote them before releases were bound (no version, no time)."""
    key = load_private_key(private)
    sha = load_artifact(bundle, kind="bundle").manifest_sha256
    doc = {"algorithm": "ed25519", "key_sha256": public_key_id(key.public_key()), "manifest_sha256": sha,
           "signature": base64.b64encode(key.sign(b"hmt-manifest-v1\n" + sha.encode())).decode()}
    (bundle / SIGNATURE_NAME).write_text(json.dumps(doc))


@pytest.fixture()
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_key_pair(tmp_path / "keys" / "sign.pem")


def test_the_signature_binds_version_and_time(bundle_copy: Path, keys: tuple[Path, Path]) -> None:
    private, public = keys
    _sign(bundle_copy, private, 3, NEW)
    load_checked_bundle(bundle_copy, trusted_key=public)
    doc = json.loads((bundle_copy / SIGNATURE_NAME).read_text())
    assert doc["version"] == 3 and doc["created_utc"] == NEW
    doc["version"] = 9  # a newer version claimed without the key: the signature no longer matches
    (bundle_copy / SIGNATURE_NAME).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="does not match"):
        load_checked_bundle(bundle_copy, trusted_key=public)


def test_an_older_signed_bundle_is_refused_where_a_newer_was_seen(bundle_copy: Path, keys: tuple[Path, Path],
                                                                  tmp_path: Path) -> None:
    private, public = keys
    policy = RollbackPolicy(state_dir=tmp_path / "state")
    _sign(bundle_copy, private, 2, OLD)
    load_checked_bundle(bundle_copy, trusted_key=public, rollback=policy)
    load_checked_bundle(bundle_copy, trusted_key=public, rollback=policy)  # the same release again: fine
    state = json.loads((tmp_path / "state" / STATE_NAME).read_text())
    assert state["keys"][public_key_id(load_public_key(public))]["version"] == 2
    for version, created in ((1, NEW), (2, "2025-12-31T23:59:59+00:00")):  # lower version; same, built earlier
        _sign(bundle_copy, private, version, created)
        with pytest.raises(ArtifactError, match="roll-back refused"):
            load_checked_bundle(bundle_copy, trusted_key=public, rollback=policy)
    _sign_first_format(bundle_copy, private)  # no version at all: below any versioned release
    with pytest.raises(ArtifactError, match="roll-back refused"):
        load_checked_bundle(bundle_copy, trusted_key=public, rollback=policy)
    load_checked_bundle(bundle_copy, trusted_key=public, rollback=RollbackPolicy(tmp_path / "state", allow=True))
    _sign(bundle_copy, private, 2, NEW)  # newer: accepted and recorded
    load_checked_bundle(bundle_copy, trusted_key=public, rollback=policy)
    assert json.loads((tmp_path / "state" / STATE_NAME).read_text())["keys"][
        public_key_id(load_public_key(public))]["created_utc"] == NEW
    assert not [p for p in (tmp_path / "state").iterdir() if p.suffix == ".tmp"]  # written atomically


def test_a_corrupt_state_file_refuses_rather_than_forgets(bundle_copy: Path, keys: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    private, public = keys
    _sign(bundle_copy, private, 1, OLD)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_NAME).write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable roll-back state"):
        load_checked_bundle(bundle_copy, trusted_key=public, rollback=RollbackPolicy(tmp_path / "state"))
    # nested past the recursion limit, or a release that does not compare: RecursionError / TypeError were exit 70
    (tmp_path / "state" / STATE_NAME).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match="unreadable roll-back state"):
        load_checked_bundle(bundle_copy, trusted_key=public, rollback=RollbackPolicy(tmp_path / "state"))
    key = public_key_id(load_public_key(public))
    for seen in ({"version": "7", "created_utc": OLD}, {"version": 1, "created_utc": [OLD]}, "v1"):
        (tmp_path / "state" / STATE_NAME).write_text(json.dumps({"format": 1, "keys": {key: seen}}))
        with pytest.raises(ArtifactError, match="is not a version"):
            load_checked_bundle(bundle_copy, trusted_key=public, rollback=RollbackPolicy(tmp_path / "state"))


def test_a_state_that_cannot_be_written_is_one_line_naming_it(bundle_copy: Path, keys: tuple[Path, Path],
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk under the state folder: the file and what to do, not an OSError without a path (exit 3
    from the full command line, a traceback from the device one)."""
    from hmt.artifacts import rollback
    from hmt.errors import InputError

    private, public = keys
    _sign(bundle_copy, private, 1, OLD)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rollback.os, "fsync", full)
    state = tmp_path / "state"
    with pytest.raises(InputError, match=r"signed-releases\.json: cannot record the signed release served "
                                         r"\(No space left on device\); free space there or pass --state-dir"):
        load_checked_bundle(bundle_copy, trusted_key=public, rollback=RollbackPolicy(state))
    assert not [p for p in state.iterdir() if p.suffix == ".tmp"]


def test_state_dir_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HMT_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "hmt"
    monkeypatch.setenv("HMT_STATE_DIR", str(tmp_path / "explicit"))
    assert default_state_dir() == tmp_path / "explicit"


def test_serve_refuses_a_roll_back_and_the_flag_opts_out(bundle_copy: Path, keys: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    private, public = keys
    state = tmp_path / "state"
    policy = RollbackPolicy(state_dir=state)
    _sign(bundle_copy, private, 5, NEW)
    load_checked_bundle(bundle_copy, trusted_key=public, rollback=policy)
    _sign(bundle_copy, private, 4, NEW)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "commands", "serve", str(bundle_copy), "--port", "0",
                           "--trusted-key", str(public), "--state-dir", str(state)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == ArtifactError.exit_code and "roll-back refused" in done.stderr, done.stderr
    assert "--allow-rollback" in done.stderr
