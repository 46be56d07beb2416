"""Every stage, as a user types it: --out over a user folder, over '.', over its own input.

Each is refused with exit 3 before any work, and every file is kept. The inputs are tiny
hand-made artifacts (a manifest is all the output check reads), so this runs in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hmt.artifacts import ArtifactWriter

REPO = Path(__file__).resolve().parents[2]
NANO = REPO / "profiles" / "jetson-nano.json"
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    from commands.app import _register, app

    _register()
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def _artifact(path: Path, kind: str) -> Path:
    with ArtifactWriter(path, kind=kind, config={}) as writer:
        writer.write_json("a.json", {"kind": kind})
        writer.write_json("report.json", {"variants": []})  # what fuse reads of a converted artifact first
    return path


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "in"
    (root / "data").mkdir(parents=True)
    (root / "data" / "images.bin").write_bytes(b"\x00" * 8)
    return {"supernet": _artifact(root / "supernet", "supernet"), "converted": _artifact(root / "converted",
                                                                                          "converted"),
            "fused": _artifact(root / "fused", "fused"), "pareto": _artifact(root / "pareto", "pareto"),
            "data": root / "data"}


# Each stage: (its arguments given the inputs and an output path, the input it reads that --out may name).
Stage = Callable[[dict[str, Path], str], list[str]]
STAGES: dict[str, tuple[Stage, str]] = {
    "train-supernet": (lambda i, out: ["train-supernet", "--backbone", "cifar_resnet8", "--dataset", "cifar10",
                                       "--data", str(i["data"]), "--out", out], "data"),
    "profile-device": (lambda i, out: ["profile-device", "--device", "jetson-nano", "--supernet",
                                       str(i["supernet"]), "--out", out], "supernet"),
    "pareto": (lambda i, out: ["pareto", "--supernet", str(i["supernet"]), "--profile", str(NANO), "--out", out],
               "supernet"),
    "convert": (lambda i, out: ["convert", "--supernet", str(i["supernet"]), "--variant", "largest", "--out", out],
                "supernet"),
    "fuse": (lambda i, out: ["fuse", str(i["converted"]), "--engine", "ort", "--out", out], "converted"),
    "deploy": (lambda i, out: ["deploy", "--fused", str(i["fused"]), "--pareto", str(i["pareto"]), "--target",
                               "x86-64", "--engine", "onnxruntime", "--out", out], "fused"),
    "adapt --export-bn": (lambda i, out: ["adapt", str(i["supernet"]), "--export-bn", out], "supernet"),
    "adapt": (lambda i, out: ["adapt", str(i["supernet"]), "--data", str(i["data"]), "--out", out], "supernet"),
}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("where", ["user folder", "cwd", "own input"])
def test_out_never_destroys(stage: str, where: str, inputs: dict[str, Path], tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    make, own = STAGES[stage]
    work = tmp_path / "work"
    work.mkdir()
    (work / "precious.txt").write_text("precious")
    monkeypatch.chdir(work)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    out = {"user folder": str(keep), "cwd": ".", "own input": str(inputs[own])}[where]
    before = _snapshot(tmp_path)
    code, output = invoke(*make(inputs, out))
    assert code == 3, output
    expected = {"user folder": "not an hmt artifact", "cwd": "is the working directory",
                "own input": "is an input of this command"}[where]
    assert expected in output and "Traceback" not in output
    assert _snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "keep", "work"]  # nothing new either


def test_force_replaces_an_artifact_of_another_kind_only(inputs: dict[str, Path], tmp_path: Path) -> None:
    other = inputs["pareto"]
    code, output = invoke("profile-device", "--device", "jetson-nano", "--out", str(other))
    assert code == 3 and "holds a 'pareto' artifact" in output and "--force" in output
    code, output = invoke("profile-device", "--device", "jetson-nano", "--out", str(other), "--force")
    assert code == 0, output
    assert (other / "profile.json").is_file() and not (other / "a.json").exists()
    again, output = invoke("profile-device", "--device", "jetson-nano", "--out", str(other))
    assert again == 0, output  # the same kind: replaced as before


def test_checkpoint_dir_over_a_user_folder(inputs: dict[str, Path], tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    code, output = invoke("train-supernet", "--backbone", "cifar_resnet8", "--dataset", "cifar10", "--data",
                          str(inputs["data"]), "--checkpoint-dir", str(keep), "--out", str(tmp_path / "sn"))
    assert code == 3 and "--checkpoint-dir" in output and "notes.txt" in output, output
    assert (keep / "notes.txt").read_text() == "precious" and not (tmp_path / "sn").exists()


@pytest.mark.parametrize("restart", [False, True])
def test_a_users_own_checkpoint_pt_is_never_deleted(inputs: dict[str, Path], tmp_path: Path, restart: bool) -> None:
    """checkpoint.pt is a common name: the user's own one was refused with 'delete it or pass --restart',
    and --restart deleted it."""
    import torch

    from hmt.supernet.train.checkpoint import open_checkpoint

    keep = tmp_path / "models"
    keep.mkdir()
    torch.save({"model": torch.zeros(3)}, keep / "checkpoint.pt")
    mine = (keep / "checkpoint.pt").read_bytes()
    code, output = invoke("train-supernet", "--backbone", "cifar_resnet8", "--dataset", "cifar10", "--data",
                          str(inputs["data"]), "--checkpoint-dir", str(keep), "--out", str(tmp_path / "sn"),
                          *(["--restart"] if restart else []))
    assert code == 3 and "holds checkpoint.pt, which hmt did not write" in output, output
    with pytest.raises(Exception, match="not an hmt training checkpoint; hmt does not delete"):
        open_checkpoint(keep, config_fingerprint="f", restart=True)  # specialize's and elastify's path
    assert (keep / "checkpoint.pt").read_bytes() == mine



def test_checkpoint_dir_overlapping_out_is_refused_saying_so(inputs: dict[str, Path], tmp_path: Path) -> None:
    for ckpt in (tmp_path / "sn", tmp_path / "sn" / "ck", tmp_path):
        code, output = invoke("train-supernet", "--backbone", "cifar_resnet8", "--dataset", "cifar10", "--data",
                              str(inputs["data"]), "--checkpoint-dir", str(ckpt), "--out", str(tmp_path / "sn"))
        assert code == 3 and "overlaps --out" in output and "sn.ckpt" in output, output
        assert not (tmp_path / "sn").exists()

def test_offload_halves_over_a_user_folder(inputs: dict[str, Path], tmp_path: Path) -> None:
    from hmt.deploy.offload import write_offload_bundles
    from hmt.errors import InputError

    off = tmp_path / "off"
    (off / "device").mkdir(parents=True)
    (off / "device" / "notes.txt").write_text("precious")
    with pytest.raises(InputError, match="--offload-out .*not an hmt artifact"):
        write_offload_bundles(inputs["fused"], off / "device", off / "peer")
    with pytest.raises(InputError, match="is an input"):
        write_offload_bundles(inputs["fused"], inputs["fused"], off / "peer")
    assert _snapshot(off) == {"device/notes.txt": b"precious"}


@pytest.mark.parametrize("where", [".", "home", "root"])
def test_offload_out_in_a_protected_place_is_refused(where: str, inputs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--offload-out . wrote ./device and ./peer into the working directory (and / into /device)."""
    for name in ("work", "home"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    given = {".": ".", "home": str(tmp_path / "home"), "root": "/"}[where]
    code, out = invoke("deploy", "--verify", str(inputs["fused"]), "--offload-out", given)
    assert code == 3 and f"--offload-out {given}: is the" in out
    assert not list((tmp_path / "work").iterdir()) and not list((tmp_path / "home").iterdir())


def test_archive_beside_the_bundle_is_not_a_user_file(inputs: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "bundle.tar.gz").write_text("my backup")
    code, output = invoke("deploy", "--fused", str(inputs["fused"]), "--pareto", str(inputs["pareto"]), "--target",
                          "x86-64", "--engine", "onnxruntime", "--out", str(tmp_path / "bundle"))
    assert code == 3 and "is not an hmt bundle archive" in output, output
    assert (tmp_path / "bundle.tar.gz").read_text() == "my backup"


def test_export_json_and_keys_are_never_overwritten(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": true}')
    code, output = invoke("profile-device", "--device", "jetson-nano", "--out", str(tmp_path / "p"),
                          "--export-json", str(mine))
    assert code == 3 and "--export-json" in output, output
    assert mine.read_text() == '{"mine": true}'
    code, output = invoke("profile-device", "--quick", "--out", str(tmp_path / "measured"), "--export-json", str(mine))
    assert code == 3 and "--export-json" in output and not (tmp_path / "measured").exists()  # refused before measuring
    code, output = invoke("deploy", "--gen-key", str(mine))
    assert code == 3 and "already exists" in output
    assert mine.read_text() == '{"mine": true}'
    code, output = invoke("deploy", "--gen-key", "")  # '.': its '.pub' sibling has no name (was exit 70)
    assert code == 3 and "--gen-key .: already exists" in output


def test_export_json_inside_out_is_refused_before_measuring(tmp_path: Path) -> None:
    """A single-file profile written inside the profile artifact is a file its manifest does not list."""
    out = tmp_path / "measured"
    code, output = invoke("profile-device", "--quick", "--out", str(out), "--export-json", str(out / "x.json"))
    assert code == 2 and "inside --out" in output and not out.exists(), output


def test_bracketed_messages_print_verbatim(tmp_path: Path) -> None:
    """Paths and hints holding rich-markup-like text print as typed, with the documented exit code."""
    for name in ("[monsoon]", "x[/b]y", "[red]z", "[offline]"):
        code, output = invoke("fuse", str(tmp_path / name), "--out", str(tmp_path / "o"))
        assert code == 3, output
        assert f"{tmp_path / name}: does not exist" in output and "Traceback" not in output
