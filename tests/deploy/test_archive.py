"""Deterministic archives, ELF headers, and extraction that refuses escaping entries (tar-slip)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from hmt.artifacts import ArtifactWriter
from hmt.deploy.archive import extract_archive, write_archive
from hmt.deploy.elf import parse_elf_header
from hmt.errors import ArtifactError, UnsafePathError


def _tree(root: Path) -> Path:
    with ArtifactWriter(root, kind="bundle", config={}) as writer:
        writer.write_bytes("bundle.json", b"{}\n")
        writer.write_bytes("variants/a/segment_0.onnx", b"\x00\x01" * 100)
    return root


def test_archive_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    src = _tree(tmp_path / "bundle")
    first = write_archive(src, tmp_path / "one.tar.gz").read_bytes()
    (src / "bundle.json").touch()  # a new mtime must not change the archive
    second = write_archive(src, tmp_path / "two.tar.gz").read_bytes()
    assert first == second
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        names = tar.getnames()
        # The manifest first (extraction sizes its budget from it), then sorted.
        assert names[:2] == ["bundle", "bundle/manifest.json"] and names[2:] == sorted(names[2:])
        assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in tar)
    root = extract_archive(tmp_path / "one.tar.gz", tmp_path / "x")
    assert root.name == "bundle" and (root / "variants" / "a" / "segment_0.onnx").read_bytes() == b"\x00\x01" * 100


def _evil(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        manifest = tarfile.TarInfo("bundle/manifest.json")
        manifest.size = len(_MANIFEST)
        tar.addfile(manifest, io.BytesIO(_MANIFEST))
        ok = tarfile.TarInfo("bundle/ok.json")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"{}"))
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


_MANIFEST = json.dumps({"schema_version": 1, "kind": "bundle", "tool_version": "0", "created_utc": "", "config": {},
                        "parents": [], "files": [], "environment": {}}).encode()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(("member", "message"), [
    (_member("/etc/evil"), "absolute"),
    (_member("bundle/../../evil"), r"'\.\.'"),
    (_member("bundle/link", tarfile.SYMTYPE, "/etc/passwd"), "link"),
    (_member("bundle/hard", tarfile.LNKTYPE, "/etc/passwd"), "link"),
    (_member("bundle/dev", tarfile.CHRTYPE), "device"),
    (_member("bundle/fifo", tarfile.FIFOTYPE), "device"),
])
def test_tar_slip_is_refused_before_anything_is_written(tmp_path: Path, member: tarfile.TarInfo,
                                                        message: str) -> None:
    archive = _evil(tmp_path / "evil.tar.gz", member)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafePathError, match=message):
        extract_archive(archive, dest)
    assert not any(dest.rglob("*"))  # checked first, so not even the good entry was written
    assert not (tmp_path / "evil").exists()


def test_tar_slip_through_the_cli_is_a_clear_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import commands.deploy  # noqa: F401 - registers the command
    from commands.app import app

    archive = _evil(tmp_path / "evil.tar.gz", _member("bundle/../../escaped"))
    result = CliRunner().invoke(app, ["deploy", "--verify", str(archive)])
    assert result.exit_code == ArtifactError.exit_code
    assert "contains '..'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "escaped").exists()


def test_elf_header() -> None:
    def header(machine: int, *, bits: int = 2, data: int = 1) -> bytes:
        order = "little" if data == 1 else "big"
        return b"\x7fELF" + bytes([bits, data, 1]) + bytes(9) + (3).to_bytes(2, order) + machine.to_bytes(2, order)

    assert parse_elf_header(header(183)).machine == "aarch64"
    assert parse_elf_header(header(62)).machine == "x86_64"
    big = parse_elf_header(header(40, bits=1, data=2))
    assert (big.machine, big.bits, big.little_endian) == ("arm", 32, False)
    with pytest.raises(ArtifactError, match="not an ELF"):
        parse_elf_header(b"MZ\x90\x00" + bytes(20))
