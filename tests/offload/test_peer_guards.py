"""The peer has the main server's guards: structural checks, --trusted-key, 4xx for bad numbers,
and signed offload halves that verify with the trusted key."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from hmt.artifacts import load_artifact
from hmt.artifacts.rollback import RollbackPolicy
from hmt.artifacts.signing import generate_key_pair, load_private_key, sign_artifact_dir
from hmt.bundle import load_checked_bundle
from hmt.deploy.offload import OffloadBundles, write_offload_bundles
from hmt.errors import ArtifactError
from hmt.offload.codec import encode
from hmt.offload.peer import PeerOptions, create_peer_app
from hmt.offload.server import open_peer


@pytest.fixture(scope="module")
def client(offload_bundles: OffloadBundles) -> Iterator[TestClient]:
    service = open_peer(offload_bundles.peer, PeerOptions(), threads=1)
    with TestClient(create_peer_app(service), raise_server_exceptions=False) as client:
        yield client


def _float32(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    enc = encode(x, "float32")
    return enc.body, enc.headers


def test_extreme_finite_tensors_get_a_4xx_without_exception_text(client: TestClient) -> None:
    body, headers = _float32(np.full((1, 4, 4, 4), 3e38, np.float32))
    r = client.post("/v1/segment?variant=deep&cut=1", content=body, headers=headers)
    assert r.status_code == 422 and r.json()["error"]["code"] == "input_out_of_range", r.text
    assert "Error" not in r.json()["error"]["message"]  # no exception class or text leaks
    for value in (-3e38, 1e30, -1e30):  # a finite answer (ReLU zeroes them) or a 422, never a 500
        body, headers = _float32(np.full((1, 4, 4, 4), value, np.float32))
        r = client.post("/v1/segment?variant=deep&cut=1", content=body, headers=headers)
        assert r.status_code in (200, 422), r.text


@pytest.mark.parametrize("body", [np.full(64, np.inf, np.float32).tobytes(), np.full(64, np.nan, np.float32).tobytes(),
                                  np.full(64, -np.inf, np.float32).tobytes()])
def test_the_peer_refuses_non_finite_bodies_with_a_4xx(client: TestClient, body: bytes) -> None:
    r = client.post("/v1/segment?variant=deep&cut=1", content=body, headers={"x-hmt-shape": "1,4,4,4"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_tensor"


@pytest.mark.parametrize("scale", ["1e38", "3e36", "inf", "nan", "-1", "0"])
def test_an_int8_scale_out_of_range_is_a_400(client: TestClient, scale: str) -> None:
    body = np.ones(64, np.int8).tobytes()
    r = client.post("/v1/segment?variant=deep&cut=1", content=body,
                    headers={"x-hmt-shape": "1,4,4,4", "x-hmt-codec": "int8", "x-hmt-scale": scale})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_tensor", r.text
    ok = client.post("/v1/segment?variant=deep&cut=1", content=body,
                     headers={"x-hmt-shape": "1,4,4,4", "x-hmt-codec": "int8", "x-hmt-scale": "0.01"})
    assert ok.status_code == 200, ok.text


def test_the_peer_runs_the_structural_checks(offload_bundles: OffloadBundles, tmp_path: Path) -> None:
    tampered = tmp_path / "peer"
    shutil.copytree(offload_bundles.peer, tampered)
    (tampered / "variants" / "extra.so").write_bytes(b"\x7fELF" + b"\0" * 60)  # unlisted: refused, unsigned or not
    with pytest.raises(ArtifactError, match="extra.so"):
        open_peer(tampered, PeerOptions())


def test_the_peer_takes_trusted_key(offload_bundles: OffloadBundles, tmp_path: Path) -> None:
    _, public = generate_key_pair(tmp_path / "keys" / "k.pem")
    with pytest.raises(ArtifactError, match="manifest.sig: missing"):
        open_peer(offload_bundles.peer, PeerOptions(), trusted_key=public)


def test_offload_halves_of_a_signed_bundle_verify_with_the_trusted_key(conv_bundle: Path, tmp_path: Path) -> None:
    private, public = generate_key_pair(tmp_path / "keys" / "k.pem")
    signed = tmp_path / "bundle"
    shutil.copytree(conv_bundle, signed)
    sign_artifact_dir(signed, load_artifact(signed, kind="bundle").manifest_sha256, load_private_key(private),
                      version=7)
    load_checked_bundle(signed, trusted_key=public)
    split = write_offload_bundles(signed, tmp_path / "off" / "device", tmp_path / "off" / "peer", seed=3,
                                  sign_key=private)
    policy = RollbackPolicy(state_dir=tmp_path / "state")
    # The whole bundle was served first: the halves are the same release, so no roll-back either.
    load_checked_bundle(signed, trusted_key=public, rollback=policy)
    for half in (split.device, split.peer):
        load_checked_bundle(half, trusted_key=public, rollback=policy)
    service = open_peer(split.peer, PeerOptions(), trusted_key=public, rollback=policy)
    service.shutdown()
    unsigned = write_offload_bundles(signed, tmp_path / "plain" / "device", tmp_path / "plain" / "peer", seed=3)
    with pytest.raises(ArtifactError, match="missing"):
        load_checked_bundle(unsigned.device, trusted_key=public)
