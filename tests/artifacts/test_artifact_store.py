"""The artifact layer: atomic writes, verified loads, path containment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hmt.artifacts import ArtifactWriter, load_artifact, safe_join
from hmt.artifacts.manifest import content_digest
from hmt.errors import ArtifactError, InputError, UnsafePathError


def _write(out: Path, payload: bytes = b"hello", kind: str = "demo") -> None:
    with ArtifactWriter(out, kind=kind, config={"a": 1}) as writer:
        writer.write_bytes("data.bin", payload)
        writer.write_json("nested/info.json", {"x": 1})
        writer.metrics["score"] = 0.5


def test_round_trip_records_everything(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out)
    art = load_artifact(out, kind="demo")
    m = art.manifest
    assert m.kind == "demo" and m.config == {"a": 1} and m.metrics == {"score": 0.5}
    assert {f.path for f in m.files} == {"data.bin", "nested/info.json"}
    record = next(f for f in m.files if f.path == "data.bin")
    assert record.size_bytes == 5 and len(record.sha256) == 64
    assert m.environment["python"]
    assert art.read_json("nested/info.json") == {"x": 1}


def test_parent_lineage(tmp_path: Path) -> None:
    _write(tmp_path / "parent")
    parent = load_artifact(tmp_path / "parent", kind="demo")
    with ArtifactWriter(tmp_path / "child", kind="child", config={}, parents=[parent]) as w:
        w.write_bytes("x", b"1")
    child = load_artifact(tmp_path / "child", kind="child")
    assert child.manifest.parents[0].manifest_sha256 == parent.manifest_sha256


def test_failure_inside_writer_keeps_previous_artifact(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out, b"first")
    with pytest.raises(RuntimeError), ArtifactWriter(out, kind="demo", config={}) as writer:
        writer.write_bytes("data.bin", b"second")
        raise RuntimeError("stage failed")
    assert (out / "data.bin").read_bytes() == b"first"
    assert not list(tmp_path.glob("*.partial"))
    load_artifact(out, kind="demo")


def test_interrupted_swap_is_recovered(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out)
    # Simulate a kill between the two renames: only the backup exists.
    out.rename(tmp_path / "art.hmt-previous")
    load_artifact(out, kind="demo")
    assert out.is_dir()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_tampered_file_is_refused_naming_it(tmp_path: Path, damage: str) -> None:
    out = tmp_path / "art"
    _write(out)
    target = out / "data.bin"
    if damage == "flip":
        target.write_bytes(b"hellp")
    elif damage == "truncate":
        target.write_bytes(b"hel")
    else:
        target.unlink()
    with pytest.raises(ArtifactError, match="data.bin"):
        load_artifact(out, kind="demo")


def test_wrong_kind_and_schema_refused(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out)
    with pytest.raises(ArtifactError, match="kind is 'demo', expected supernet"):
        load_artifact(out, kind="supernet")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="schema_version 99"):
        load_artifact(out, kind="demo")


@pytest.mark.parametrize("edit", ["config", "metrics", "files", "parents", "digest", "no digest"])
def test_a_hand_edited_manifest_is_refused_naming_it(tmp_path: Path, edit: str) -> None:
    """An edit of the manifest's own content (a config value, a metric, a file record, the lineage)
    changed what later stages read from it, and every file's checksum still matched: loads took it."""
    out = tmp_path / "art"
    _write(out)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    if edit == "config":
        manifest["config"]["a"] = 2
    elif edit == "metrics":
        manifest["metrics"]["score"] = 0.9
    elif edit == "files":
        manifest["files"] = manifest["files"][:1]
    elif edit == "parents":
        manifest["parents"] = [{"kind": "demo", "path": "../elsewhere", "manifest_sha256": "0" * 64}]
    elif edit == "digest":
        manifest["content_sha256"] = "0" * 64
    else:
        del manifest["content_sha256"]
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    with pytest.raises(ArtifactError) as err:
        load_artifact(out, kind="demo")
    assert str(err.value).startswith(f"{path}: ") and "content_sha256" in str(err.value)


def test_the_manifest_digest_survives_formatting_and_awkward_config(tmp_path: Path) -> None:
    """The digest is of the parsed content: reformatting the file keeps it valid, and config keys
    that JSON turns into strings (ints, sorted differently once they are strings) and non-ASCII
    text hash the same for the writer and the reader."""
    out = tmp_path / "art"
    with ArtifactWriter(out, kind="demo", config={"ids": {9: "a", 10: "b", 1: "c"}, "name": "Grüße ✓",
                                                  "x": 0.1 + 0.2, "t": (1, 2)}) as writer:
        writer.write_bytes("data.bin", b"1")
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["content_sha256"] == content_digest(manifest) and manifest["schema_version"] == 2
    path.write_text(json.dumps(manifest, ensure_ascii=False))  # one line, unescaped: same content
    assert load_artifact(out, kind="demo").manifest.config["name"] == "Grüße ✓"


def test_a_version_1_manifest_without_a_digest_still_loads(tmp_path: Path) -> None:
    """Artifacts written before manifests carried their digest keep working (their files are verified)."""
    out = tmp_path / "art"
    _write(out)
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = 1
    del manifest["content_sha256"]
    path.write_text(json.dumps(manifest))
    assert load_artifact(out, kind="demo").manifest.schema_version == 1
    (out / "data.bin").write_bytes(b"changed")
    with pytest.raises(ArtifactError, match="data.bin: size"):
        load_artifact(out, kind="demo")


def test_manifest_entry_escaping_directory_refused(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out)
    (tmp_path / "secret").write_bytes(b"x")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"].append({"path": "../secret", "sha256": "0" * 64, "size_bytes": 1, "media_type": "x"})
    manifest["content_sha256"] = content_digest(manifest)  # resealed, as a writer of hostile artifacts would
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsafePathError):
        load_artifact(out, kind="demo")


def test_missing_directory_and_manifest(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist; expected a demo artifact directory"):
        load_artifact(tmp_path / "nope", kind="demo")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="manifest.json: missing"):
        load_artifact(tmp_path / "empty", kind="demo")


def test_safe_join(tmp_path: Path) -> None:
    assert safe_join(tmp_path, "a/b.txt") == tmp_path.resolve() / "a" / "b.txt"
    for bad in ("../x", "/etc/passwd", "a/../../x", ""):
        with pytest.raises(UnsafePathError):
            safe_join(tmp_path, bad)
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(UnsafePathError, match="outside"):
        safe_join(tmp_path, "link/passwd")


def test_current_directory_as_artifact_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "art"
    _write(out)
    monkeypatch.chdir(out)
    assert load_artifact(Path("."), kind="demo").kind == "demo"


def test_a_changed_file_is_named_as_the_artifact_was_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative artifact path stays relative in the message (what the user typed), not resolved."""
    _write(tmp_path / "art")
    (tmp_path / "art" / "nested" / "info.json").write_text('{"x": 2}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArtifactError) as err:
        load_artifact(Path("art"), kind="demo")
    message = str(err.value)
    assert message.startswith("art/nested/info.json: ") and "was changed" in message and str(tmp_path) not in message


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{"], ids=["nested", "not-utf8"])
def test_manifest_and_listed_json_that_json_cannot_parse_are_refused_naming_them(tmp_path: Path, raw: bytes) -> None:
    """Brackets nested past the recursion limit and bytes that are not UTF-8 are bad files (exit 4),
    not internal errors (json.loads raises RecursionError and UnicodeDecodeError for them)."""
    from hmt.artifacts.outputs import check_output_dir
    from hmt.artifacts.store import sha256_file

    out = tmp_path / "art"
    _write(out)
    info = out / "nested" / "info.json"
    info.write_bytes(raw)
    manifest = json.loads((out / "manifest.json").read_text())
    for record in manifest["files"]:
        if record["path"] == "nested/info.json":
            record.update(sha256=sha256_file(info), size_bytes=len(raw))
    manifest["content_sha256"] = content_digest(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"info\.json: not valid JSON"):
        load_artifact(out, kind="demo").read_json("nested/info.json")
    (out / "manifest.json").write_bytes(raw)
    with pytest.raises(ArtifactError, match=r"manifest\.json: not valid JSON"):
        load_artifact(out, kind="demo")
    with pytest.raises(InputError, match="not an hmt artifact"):
        check_output_dir(out, kind="demo")


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_artifact_folder_and_manifest_get_the_umask_mode_not_tempfiles_private_one(tmp_path: Path, umask: int) -> None:
    """The artifact is built in a tempfile folder (0700) with a tempfile manifest (0600); renamed into
    place they kept that mode, so a bundle copied to a device was unreadable by the service's user."""
    import os
    import stat

    previous = os.umask(umask)
    try:
        out = tmp_path / "art"
        _write(out)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "manifest.json").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((out / "data.bin").stat().st_mode) == 0o666 & ~umask


def test_a_full_disk_while_writing_is_one_input_error_and_keeps_the_previous_artifact(tmp_path: Path) -> None:
    """ENOSPC/EROFS while an artifact is written exited 70 ('internal error ... report it')."""
    import errno

    out = tmp_path / "art"
    _write(out, b"previous")
    with pytest.raises(InputError, match=r"--out .*art: cannot be written \(No space left on device\); nothing was "
                                         "replaced"), ArtifactWriter(out, kind="demo", config={}) as writer:
        writer.write_bytes("data.bin", b"new")
        raise OSError(errno.ENOSPC, "No space left on device", str(writer.path("big.onnx")))
    assert (out / "data.bin").read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # the temporary folder went
    with pytest.raises(PermissionError), ArtifactWriter(tmp_path / "other", kind="demo", config={}):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "an-input.csv"))  # reading: not ours


def test_a_recovery_waits_for_a_swap_in_progress(tmp_path: Path) -> None:
    """Two writers of one output (or a reader beside a writer) interleaved their renames: one put back the
    backup the other had just moved aside, whose rename then failed; both could exit 70."""
    import os
    import threading

    from hmt.artifacts.swap import recover_interrupted_swap, swap_lock

    out, new = tmp_path / "art", tmp_path / "new"
    _write(out, b"old")
    _write(new, b"new")
    with swap_lock(out):  # a writer between its two renames
        os.replace(out, tmp_path / "art.hmt-previous")
        reader = threading.Thread(target=recover_interrupted_swap, args=(out,))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive()  # it waits instead of moving the backup back under the writer
        os.replace(new, out)
    reader.join(5)
    assert not reader.is_alive()
    assert (out / "data.bin").read_bytes() == b"new" and not (tmp_path / "art.hmt-previous").exists()
