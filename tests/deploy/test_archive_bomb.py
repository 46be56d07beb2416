"""Archive bombs: extraction checks declared sizes against the manifest and a budget, before writing.

The bombs are real gzip'd tars of zeros (a 16 MiB entry compresses to ~16 KB); the budget
of a bundle whose manifest lists a few hundred bytes is about 1 MiB.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import commands.deploy  # noqa: F401 - registers the command
from commands.app import app
from hmt.artifacts import ArtifactWriter
from hmt.deploy.archive import BUDGET_FACTOR, extract_archive, write_archive
from hmt.errors import ArtifactError

BOMB_BYTES = 16 << 20


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, streamed (the bomb is never held in memory)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def _bundle(root: Path) -> Path:
    with ArtifactWriter(root, kind="bundle", config={}) as writer:
        writer.write_bytes("bundle.json", b"{}\n")
        writer.write_bytes("variants/a/segment_0.onnx", b"\x00\x01" * 100)
    return root


def _tar(path: Path, entries: list[tuple[str, int, bytes | None]]) -> Path:
    """``entries``: (name, declared size, data or None for zeros)."""
    with open(path, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
        for name, size, data in entries:
            info = tarfile.TarInfo(name)
            info.size = size
            source = io.BytesIO(data) if data is not None else io.BufferedReader(_Zeros(size))
            tar.addfile(info, source)
    return path


def _manifest_entry(bundle: Path) -> tuple[str, int, bytes]:
    data = (bundle / "manifest.json").read_bytes()
    return ("bundle/manifest.json", len(data), data)


def _written(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def test_an_unlisted_bomb_after_the_manifest_is_refused_before_writing(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    archive = _tar(tmp_path / "bomb.tar.gz", [
        _manifest_entry(bundle),
        ("bundle/bundle.json", 3, b"{}\n"),
        ("bundle/variants/a/huge.so", BOMB_BYTES, None),
    ])
    assert archive.stat().st_size * 200 < BOMB_BYTES  # a real bomb: a high expansion ratio
    dest = tmp_path / "dest"
    with pytest.raises(ArtifactError, match=r"over the extraction budget of \d+ bytes \(2x the 2 files"):
        extract_archive(archive, dest)
    assert _written(dest) == 0


def test_a_listed_entry_declaring_more_than_the_manifest_is_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    archive = _tar(tmp_path / "bomb.tar.gz", [
        _manifest_entry(bundle),
        ("bundle/variants/a/segment_0.onnx", BOMB_BYTES, None),
    ])
    dest = tmp_path / "dest"
    with pytest.raises(ArtifactError, match=r"segment_0.onnx' declares 16777216 bytes, manifest.json lists 200"):
        extract_archive(archive, dest)
    assert _written(dest) == 0


def test_a_bomb_before_the_manifest_meets_the_hard_limit(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    archive = _tar(tmp_path / "bomb.tar.gz", [("bundle/a.bin", BOMB_BYTES, None), _manifest_entry(bundle)])
    with pytest.raises(ArtifactError, match="no manifest.json read yet"):
        extract_archive(archive, tmp_path / "dest", max_total_bytes=1 << 20)
    assert _written(tmp_path / "dest") == 0


def test_a_bomb_before_the_manifest_is_bounded_by_the_archives_size(tmp_path: Path) -> None:
    """Without a manifest first, entries may declare 16x the archive's size + 64 MiB (a bomb: ~1000x)."""
    bundle = _bundle(tmp_path / "bundle")
    archive = _tar(tmp_path / "bomb.tar.gz", [("bundle/a.bin", 6 * BOMB_BYTES, None), _manifest_entry(bundle)])
    with pytest.raises(ArtifactError, match=r"no manifest.json read yet: at most 16x the archive's size"):
        extract_archive(archive, tmp_path / "dest")
    assert _written(tmp_path / "dest") == 0


def test_entries_before_the_manifest_count_against_its_budget(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    archive = _tar(tmp_path / "bomb.tar.gz", [("bundle/a.bin", 4 << 20, None), _manifest_entry(bundle)])
    with pytest.raises(ArtifactError, match="entries before manifest.json already exceed its budget"):
        extract_archive(archive, tmp_path / "dest")
    assert _written(tmp_path / "dest") == 0


def test_too_many_entries_are_refused(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    entries = [_manifest_entry(bundle)] + [(f"bundle/x/{i}", 0, b"") for i in range(200)]
    archive = _tar(tmp_path / "many.tar.gz", entries)
    with pytest.raises(ArtifactError, match="more than 70 entries"):
        extract_archive(archive, tmp_path / "dest")


def test_an_archive_without_a_manifest_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "none.tar.gz", [("bundle/a.json", 2, b"{}")])
    with pytest.raises(ArtifactError, match="no manifest.json in the archive"):
        extract_archive(archive, tmp_path / "dest")
    assert _written(tmp_path / "dest") == 0


def test_a_real_bundle_archive_extracts_within_its_budget(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    archive = write_archive(bundle, tmp_path / "ok.tar.gz")
    root = extract_archive(archive, tmp_path / "dest")
    listed = sum(f["size_bytes"] for f in json.loads((bundle / "manifest.json").read_text())["files"])
    assert _written(root) <= BUDGET_FACTOR * listed + (1 << 20)
    assert (root / "variants" / "a" / "segment_0.onnx").read_bytes() == b"\x00\x01" * 100


def test_the_cli_refuses_a_bomb_with_exit_4_and_no_traceback(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path / "bundle")
    archive = _tar(tmp_path / "bomb.tar.gz", [_manifest_entry(bundle), ("bundle/variants/a/huge.so", BOMB_BYTES, None)])
    result = CliRunner().invoke(app, ["deploy", "--verify", str(archive)])
    assert result.exit_code == ArtifactError.exit_code, result.output
    assert "extraction budget" in result.output and "Traceback" not in result.output


def test_data_beyond_the_declared_size_stops_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: the bytes written are counted, whatever the headers said."""
    bundle = _bundle(tmp_path / "bundle")
    archive = write_archive(bundle, tmp_path / "ok.tar.gz")
    real = tarfile.TarFile.extractfile

    def lying(self: tarfile.TarFile, member: tarfile.TarInfo | str) -> io.BufferedReader | None:
        source = real(self, member)
        if isinstance(member, tarfile.TarInfo) and member.name.endswith("segment_0.onnx") and source is not None:
            return io.BufferedReader(io.BytesIO(source.read() + bytes(4096)))  # type: ignore[arg-type]
        return source

    monkeypatch.setattr(tarfile.TarFile, "extractfile", lying)
    with pytest.raises(ArtifactError, match="expands past its declared size"):
        extract_archive(archive, tmp_path / "dest")


@pytest.mark.parametrize(("kind", "compression"), [(tarfile.XHDTYPE, "gz"), (tarfile.GNUTYPE_LONGNAME, "gz"),
                                                   (tarfile.XHDTYPE, "xz")])
def test_a_metadata_header_declaring_a_huge_size_is_refused_before_it_is_read(
        tmp_path: Path, kind: bytes, compression: str) -> None:
    """tarfile reads a PAX or GNU long-name header's data whole, at the size it declares, before
    hmt sees the entry: a 300 kB gzip of one 300 MB PAX header took 370 MB of memory."""
    import gzip
    import lzma

    size = 64 << 20
    info = tarfile.TarInfo("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink")
    info.type, info.size = kind, size
    archive = tmp_path / f"bomb.tar.{compression}"
    with (gzip.open(archive, "wb", compresslevel=1) if compression == "gz"
          else lzma.open(archive, "wb", preset=0)) as raw:
        raw.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        zeros = bytes(1 << 20)
        for _ in range(size >> 20):
            raw.write(zeros)
    with pytest.raises(ArtifactError, match=f"declares {size} bytes of metadata"):
        extract_archive(archive, tmp_path / "dest")
    assert not any((tmp_path / "dest").iterdir())


def test_bzip2_xz_and_plain_tars_still_extract(tmp_path: Path) -> None:
    import bz2
    import gzip
    import lzma

    bundle = _bundle(tmp_path / "b")
    archive = write_archive(bundle)
    plain = gzip.decompress(archive.read_bytes())
    for name, data in (("b.tar", plain), ("b.tar.bz2", bz2.compress(plain)), ("b.tar.xz", lzma.compress(plain))):
        (tmp_path / name).write_bytes(data)
        root = extract_archive(tmp_path / name, tmp_path / f"out-{name}")
        assert (root / "variants/a/segment_0.onnx").read_bytes() == b"\x00\x01" * 100
