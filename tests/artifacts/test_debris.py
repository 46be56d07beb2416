"""Killed writers' debris (.partial directories, .tmp files) is cleaned by the next good write.

The writers here are real processes killed with SIGKILL at the awkward moment, so nothing
of theirs (finally blocks, atexit) runs: what they leave is what a kill leaves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hmt.artifacts import ArtifactWriter, atomic_write_bytes, load_artifact
from hmt.artifacts.store import LEGACY_STALE_AGE_S, clean_stale_temporaries

REPO = Path(__file__).resolve().parents[2]

# Kills itself inside the writer's block (after writing a file) or inside atomic_write_bytes
# (after the temporary file is written, at the rename).
_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from hmt.artifacts import ArtifactWriter, atomic_write_bytes
    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "writer":
        with ArtifactWriter(out, kind="demo", config={}) as w:
            w.write_bytes("data.bin", b"x" * 1000)
            os.kill(os.getpid(), signal.SIGKILL)
    else:
        def killed_replace(src, dst):
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace = killed_replace
        atomic_write_bytes(out, b"new contents")
""")


def _run_killed(out: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out), mode], env=env, timeout=120,
                          capture_output=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _write(out: Path, payload: bytes = b"good") -> None:
    with ArtifactWriter(out, kind="demo", config={}) as writer:
        writer.write_bytes("data.bin", payload)


def test_next_successful_write_removes_killed_writers_partials(tmp_path: Path) -> None:
    out = tmp_path / "art"
    _write(out, b"first")
    for _ in range(3):
        _run_killed(out, "writer")
    leftovers = _hidden(tmp_path)
    assert len(leftovers) == 3 and all(name.endswith(".partial") for name in leftovers), leftovers
    assert load_artifact(out, kind="demo").file("data.bin").read_bytes() == b"first"
    _write(out, b"second")
    assert _hidden(tmp_path) == []
    assert load_artifact(out, kind="demo").file("data.bin").read_bytes() == b"second"


def test_atomic_write_removes_killed_writers_tmp_files(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_write_bytes(target, b"old")
    _run_killed(target, "atomic")
    _run_killed(target, "atomic")
    assert len([n for n in _hidden(tmp_path) if n.endswith(".tmp")]) == 2
    assert target.read_bytes() == b"old"
    atomic_write_bytes(target, b"fresh")
    assert _hidden(tmp_path) == []
    assert target.read_bytes() == b"fresh"


def test_a_running_writers_partial_is_kept(tmp_path: Path) -> None:
    """A concurrent writer of the same output (alive) keeps its temporary directory."""
    out = tmp_path / "art"
    script = textwrap.dedent("""
        import sys
        from hmt.artifacts import ArtifactWriter
        with ArtifactWriter(sys.argv[1], kind="demo", config={}) as w:
            w.write_bytes("data.bin", b"slow")
            print("ready", flush=True)
            sys.stdin.readline()
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    slow = subprocess.Popen([sys.executable, "-c", script, str(out)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert slow.stdout is not None and slow.stdout.readline().strip() == "ready"
        _write(out, b"fast")
        assert any(name.endswith(".partial") for name in _hidden(tmp_path))
    finally:
        assert slow.stdin is not None
        slow.stdin.write("\n")
        slow.stdin.close()
        slow.wait(timeout=60)
    assert slow.returncode == 0
    assert _hidden(tmp_path) == []
    assert load_artifact(out, kind="demo").file("data.bin").read_bytes() == b"slow"


def test_legacy_names_are_removed_only_when_old(tmp_path: Path) -> None:
    (tmp_path / "art").mkdir()
    old = tmp_path / ".art.abcd1234.partial"
    young = tmp_path / ".art.wxyz5678.partial"
    other = tmp_path / ".other.abcd1234.partial"  # another output's: never ours to remove
    for path in (old, young, other):
        path.mkdir()
    past = time.time() - LEGACY_STALE_AGE_S - 60
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    removed = clean_stale_temporaries(tmp_path, "art")
    assert removed == [old]
    assert young.exists() and other.exists()


@pytest.mark.parametrize("name", ["x", "x.tar.gz"])
def test_foreign_hosts_temporaries_are_kept(tmp_path: Path, name: str) -> None:
    foreign = tmp_path / f".{name}.hmt~some-other-host~1~abcdefgh.tmp"
    foreign.write_bytes(b"")
    assert clean_stale_temporaries(tmp_path, name) == []
    assert foreign.exists()


def _write(out: Path, payload: bytes) -> None:
    with ArtifactWriter(out, kind="demo", config={}) as writer:
        writer.write_bytes("data.bin", payload)


@pytest.mark.parametrize("left", ["manifest and part of the files", "an empty folder"])
def test_a_backup_left_by_a_killed_removal_does_not_block_the_next_write(tmp_path: Path, left: str) -> None:
    out = tmp_path / "art"
    _write(out, b"old")
    backup = tmp_path / "art.hmt-previous"
    if left == "an empty folder":
        backup.mkdir()
    else:  # killed while removing the previous artifact moved aside: its manifest goes last
        import shutil

        shutil.copytree(out, backup)
        (backup / "data.bin").unlink()
    _write(out, b"new")
    assert load_artifact(out, kind="demo").file("data.bin").read_bytes() == b"new"
    assert not backup.exists()


def test_a_user_folder_under_the_backup_name_is_kept_and_named(tmp_path: Path) -> None:
    from hmt.errors import ArtifactError

    out = tmp_path / "art"
    _write(out, b"old")
    backup = tmp_path / "art.hmt-previous"
    backup.mkdir()
    (backup / "notes.txt").write_text("precious")
    with pytest.raises(ArtifactError, match="art.hmt-previous"):
        _write(out, b"new")
    assert (backup / "notes.txt").read_text() == "precious"
    assert load_artifact(out, kind="demo").file("data.bin").read_bytes() == b"old"
