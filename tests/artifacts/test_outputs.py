"""The output-path policy: only hmt's own artifacts of the same kind are replaced, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.artifacts import ArtifactWriter
from hmt.artifacts.outputs import check_output_dir, check_output_file, check_owned_folder, remove_owned_files
from hmt.errors import InputError


def _artifact(path: Path, kind: str) -> Path:
    with ArtifactWriter(path, kind=kind, config={}) as writer:
        writer.write_json("a.json", {"x": 1})
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_new_empty_and_same_kind_are_allowed(tmp_path: Path) -> None:
    check_output_dir(tmp_path / "new", kind="demo")
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", kind="demo")
    check_output_dir(_artifact(tmp_path / "same", "demo"), kind="demo")


def test_user_folder_is_refused_even_with_force(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    for force in (False, True):
        with pytest.raises(InputError, match="not an hmt artifact"):
            check_output_dir(keep, kind="demo", force=force)
    with pytest.raises(InputError, match="not an hmt artifact"), ArtifactWriter(keep, kind="demo", config={}) as w:
        w.write_json("a.json", {})
    assert _files(keep) == {"notes.txt": b"precious"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]  # no temporary left either


def test_other_kind_needs_force(tmp_path: Path) -> None:
    other = _artifact(tmp_path / "other", "pareto")
    with pytest.raises(InputError, match="holds a 'pareto' artifact; this command writes a 'demo'.*--force"):
        check_output_dir(other, kind="demo")
    check_output_dir(other, kind="demo", force=True)
    _artifact_force = ArtifactWriter(other, kind="demo", config={}, force=True)
    with _artifact_force as writer:
        writer.write_json("b.json", {})
    assert (other / "b.json").is_file() and not (other / "a.json").exists()


def test_artifact_holding_a_user_file_is_refused(tmp_path: Path) -> None:
    art = _artifact(tmp_path / "art", "demo")
    (art / "mine.txt").write_text("mine")
    with pytest.raises(InputError, match="holds mine.txt, which its manifest.json does not list"):
        check_output_dir(art, kind="demo", force=True)


def test_protected_places_and_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work / "sub")
    for out, reason in ((".", "the working directory"), ("..", "a folder above the working directory"),
                        ("/", "the root directory"), (str(Path.home()), "the home directory")):
        with pytest.raises(InputError, match=reason):
            check_output_dir(out, kind="demo")
    src = _artifact(tmp_path / "runs" / "src", "demo")
    with pytest.raises(InputError, match="is an input of this command"):
        check_output_dir(src, kind="demo", inputs=[src])
    with pytest.raises(InputError, match="holds the input"):
        check_output_dir(tmp_path / "runs", kind="demo", inputs=[src])
    with pytest.raises(InputError, match="lies inside the input"):
        check_output_dir(src / "x", kind="demo", inputs=[src])
    # The writer takes its parents as inputs: a stage never replaces what it reads.
    from hmt.artifacts import load_artifact

    parent = load_artifact(src, kind="demo")
    with pytest.raises(InputError, match="is an input"), ArtifactWriter(src, kind="demo", config={}, parents=[parent]):
        pass


def test_files_are_replaced_only_when_recognised(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    with pytest.raises(InputError, match="exists and is not a profile"):
        check_output_file(mine, recognise=lambda p: False, description="a profile")
    check_output_file(mine, recognise=lambda p: True, description="a profile")
    check_output_file(tmp_path / "new.json", recognise=lambda p: False, description="a profile")


def test_owned_folder_keeps_what_is_not_ours(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint.pt").write_bytes(b"x")
    check_owned_folder(ckpt, names=("checkpoint.pt",), what="--checkpoint-dir")
    (ckpt / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="--checkpoint-dir .*holds notes.txt"):
        check_owned_folder(ckpt, names=("checkpoint.pt",), what="--checkpoint-dir")
    remove_owned_files(ckpt, names=("checkpoint.pt",))
    assert _files(ckpt) == {"notes.txt": b"mine"}
    (ckpt / "notes.txt").unlink()
    (ckpt / "checkpoint.pt").write_bytes(b"x")
    remove_owned_files(ckpt, names=("checkpoint.pt",))
    assert not ckpt.exists()


def test_parents_are_recorded_relative_to_the_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from hmt.artifacts import load_artifact
    from hmt.artifacts.lineage import find_parent

    monkeypatch.chdir(tmp_path)
    parent = load_artifact(_artifact(Path("a") / "parent", "demo"), kind="demo")
    with ArtifactWriter(Path("a") / "child", kind="child", config={}, parents=[parent]) as writer:
        writer.write_json("c.json", {})
    child = load_artifact(tmp_path / "a" / "child", kind="child")
    assert child.manifest.parents[0].path == "../parent"
    shutil.move(tmp_path / "a", tmp_path / "moved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    moved = load_artifact(tmp_path / "moved" / "child", kind="child")
    found = find_parent(moved, moved.manifest.parents[0])
    assert found is not None and found.root.resolve() == (tmp_path / "moved" / "parent").resolve()
    # Renamed beside it: found by its manifest's sha256.
    (tmp_path / "moved" / "parent").rename(tmp_path / "moved" / "renamed")
    found = find_parent(moved, moved.manifest.parents[0])
    assert found is not None and found.root.name == "renamed"


def test_timeline_folder_holding_a_users_file_of_a_timeline_name_is_refused(tmp_path: Path) -> None:
    """--timeline-out judged ownership by file name only: a user's own summary.json (or requests.csv)
    in the folder was overwritten by the replay's."""
    import json

    from hmt.serve.reporting.timeline import TIMELINE_FILES, is_timeline_file, write_csv
    from hmt.serve.running.scenario import RequestRecord

    out = tmp_path / "results"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    with pytest.raises(InputError, match="--timeline-out .*holds summary.json, which hmt did not write"):
        check_owned_folder(out, names=TIMELINE_FILES, what="--timeline-out", recognise=is_timeline_file)
    (out / "summary.json").write_text(json.dumps({"label": "adaptive", "via": "api", "duration_s": 1.0,
                                                  "requests": 3, "clients": 1}))
    write_csv(out / "requests.csv", [RequestRecord(0.0, 200, 1.0, 1.0, 1.0, "v", 0, 0, None, None)])
    check_owned_folder(out, names=TIMELINE_FILES, what="--timeline-out", recognise=is_timeline_file)  # a replay's
    (out / "timeline.csv").write_text("when,what\n1,2\n")
    with pytest.raises(InputError, match="holds timeline.csv, which hmt did not write"):
        check_owned_folder(out, names=TIMELINE_FILES, what="--timeline-out", recognise=is_timeline_file)
    assert (out / "timeline.csv").read_text() == "when,what\n1,2\n"
