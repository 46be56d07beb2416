"""Archives: a cap the archive's own manifest cannot raise, and with a trusted key the signature
checked before anything but the manifest is read."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_archive_bomb import _bundle, _tar, _written

from hmt.artifacts import load_artifact
from hmt.artifacts.manifest import content_digest
from hmt.artifacts.signing import generate_key_pair, load_private_key, load_public_key, sign_artifact_dir
from hmt.deploy.archive import PRE_MANIFEST_FLOOR_BYTES, PRE_MANIFEST_RATIO, extract_archive, write_archive
from hmt.errors import ArtifactError, InputError

LISTED_BOMB_BYTES = PRE_MANIFEST_FLOOR_BYTES + (16 << 20)  # past the cap of a small archive, listed in its manifest


def _listed_bomb(tmp_path: Path) -> Path:
    """An archive whose own manifest lists a file of zeros larger than the cap allows."""
    bundle = _bundle(tmp_path / "bundle")
    manifest = json.loads((bundle / "manifest.json").read_text())
    digest = hashlib.sha256()
    chunk = bytes(1 << 20)
    for _ in range(LISTED_BOMB_BYTES >> 20):
        digest.update(chunk)
    manifest["files"].append({"path": "variants/a/huge.so", "sha256": digest.hexdigest(),
                              "size_bytes": LISTED_BOMB_BYTES, "media_type": "application/octet-stream"})
    manifest["content_sha256"] = content_digest(manifest)  # resealed, as a hostile archive's maker would
    data = json.dumps(manifest).encode()
    return _tar(tmp_path / "listed-bomb.tar.gz", [("bundle/manifest.json", len(data), data),
                                                  ("bundle/variants/a/huge.so", LISTED_BOMB_BYTES, None)])


def test_a_bomb_listed_in_its_own_manifest_is_refused(tmp_path: Path) -> None:
    archive = _listed_bomb(tmp_path)
    cap = PRE_MANIFEST_RATIO * archive.stat().st_size + PRE_MANIFEST_FLOOR_BYTES
    assert cap < LISTED_BOMB_BYTES  # the manifest would allow 2x its listing; the cap does not
    dest = tmp_path / "dest"
    with pytest.raises(ArtifactError, match="extraction budget"):
        extract_archive(archive, dest)
    assert _written(dest) == 0


@pytest.fixture()
def signed(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(signed bundle, its archive, the public key)."""
    private, public = generate_key_pair(tmp_path / "keys" / "k.pem")
    bundle = _bundle(tmp_path / "signed")
    sign_artifact_dir(bundle, load_artifact(bundle, kind="bundle").manifest_sha256, load_private_key(private))
    return bundle, write_archive(bundle, tmp_path / "signed.tar.gz"), public


def test_a_signed_archive_extracts_with_its_trusted_key(signed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, archive, public = signed
    root = extract_archive(archive, tmp_path / "dest", trusted_key=load_public_key(public))
    assert (root / "manifest.sig").is_file() and (root / "variants" / "a" / "segment_0.onnx").is_file()


def test_an_unsigned_archive_is_refused_before_extraction(tmp_path: Path) -> None:
    _, public = generate_key_pair(tmp_path / "keys" / "k.pem")
    bundle = _bundle(tmp_path / "bundle")
    manifest = (bundle / "manifest.json").read_bytes()
    # Its second file is a 16 MiB entry of zeros: refused at its header, nothing written.
    archive = _tar(tmp_path / "unsigned.tar.gz", [("bundle/manifest.json", len(manifest), manifest),
                                                  ("bundle/variants/a/segment_0.onnx", 16 << 20, None)])
    dest = tmp_path / "dest"
    with pytest.raises(ArtifactError, match="no manifest.sig right after manifest.json"):
        extract_archive(archive, dest, trusted_key=load_public_key(public))
    assert _written(dest) == 0
    plain = write_archive(bundle, tmp_path / "plain.tar.gz")
    with pytest.raises(ArtifactError, match="must be signed"):
        extract_archive(plain, tmp_path / "dest2", trusted_key=load_public_key(public))
    assert _written(tmp_path / "dest2") == 0


def test_an_archive_signed_by_another_key_is_refused_before_extraction(signed: tuple[Path, Path, Path],
                                                                        tmp_path: Path) -> None:
    _, archive, _ = signed
    _, other = generate_key_pair(tmp_path / "keys" / "other.pem")
    with pytest.raises(ArtifactError, match="not by the trusted key"):
        extract_archive(archive, tmp_path / "dest", trusted_key=load_public_key(other))
    assert _written(tmp_path / "dest") == 0


def _rewrite(archive: Path, out: Path, change: dict[str, bytes], extra: tuple[str, bytes] | None = None) -> Path:
    with tarfile.open(archive, "r:gz") as src, open(out, "wb") as raw, \
            tarfile.open(fileobj=raw, mode="w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            name = member.name.split("/", 1)[-1]
            if data is not None and name in change:
                data = change[name]
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
        if extra is not None:
            info = tarfile.TarInfo(extra[0])
            info.size = len(extra[1])
            dst.addfile(info, io.BytesIO(extra[1]))
    return out


def test_a_signed_archive_with_a_changed_or_extra_file_is_refused(signed: tuple[Path, Path, Path],
                                                                  tmp_path: Path) -> None:
    bundle, archive, public = signed
    key = load_public_key(public)
    same_size = b"\x09" * len((bundle / "variants/a/segment_0.onnx").read_bytes())
    changed = _rewrite(archive, tmp_path / "changed.tar.gz", {"variants/a/segment_0.onnx": same_size})
    with pytest.raises(ArtifactError, match="signed manifest.json lists"):
        extract_archive(changed, tmp_path / "d1", trusted_key=key)
    extra = _rewrite(archive, tmp_path / "extra.tar.gz", {}, ("signed/variants/a/evil.so", b"\x7fELF"))
    with pytest.raises(ArtifactError, match="not in the signed manifest.json; refused before extracting"):
        extract_archive(extra, tmp_path / "d2", trusted_key=key)
    assert _written(tmp_path / "d2") == 0


@pytest.mark.parametrize("content", [b"", b"plain text, not a tar archive at all"])
def test_a_file_that_is_no_archive_gets_one_line(tmp_path: Path, content: bytes) -> None:
    # tarfile's "r:*" names every compression it tried, one per line; the message must stay one line.
    archive = tmp_path / "bundle.tar.gz"
    archive.write_bytes(content)
    with pytest.raises(InputError) as err:
        extract_archive(archive, tmp_path / "out")
    message = str(err.value)
    assert message.startswith(f"{archive}: not a readable tar archive (") and "\n" not in message
