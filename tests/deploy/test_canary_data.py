"""deploy --adaptable --canary-data: a seeded labelled subset ships as adapt/canary.npz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.deploy.adaptable import CANARY_MAX_SAMPLES, ship_canary
from hmt.errors import UsageError


def test_a_seeded_subset_ships_and_is_listed(tmp_path: Path) -> None:
    source = tmp_path / "held_out.npz"
    x = np.arange(600 * 3 * 4 * 4, dtype=np.float32).reshape(600, 3, 4, 4)
    np.savez(source, x=x, y=np.arange(600) % 10)
    with ArtifactWriter(tmp_path / "bundle", kind="bundle", config={}) as writer:
        record = ship_canary(writer, source, seed=3)
    artifact = load_artifact(tmp_path / "bundle", kind="bundle")
    assert "adapt/canary.npz" in [f.path for f in artifact.manifest.files]
    with np.load(artifact.file("adapt/canary.npz")) as shipped:
        assert len(shipped["y"]) == CANARY_MAX_SAMPLES == record["samples"] and record["of"] == 600
        rows = (shipped["x"][:, 0, 0, 0] / 48).astype(int)  # each sample's index in the source
        assert np.array_equal(shipped["y"], rows % 10)  # labels stay with their inputs


@pytest.mark.parametrize("y", [np.zeros((4, 2)), np.zeros(3), np.array([0.5, 1, 2, 3])])
def test_bad_canary_data_is_a_usage_error(tmp_path: Path, y: np.ndarray) -> None:
    source = tmp_path / "bad.npz"
    np.savez(source, x=np.zeros((4, 3), np.float32), y=y)
    with ArtifactWriter(tmp_path / "bundle", kind="bundle", config={}) as writer, \
            pytest.raises(UsageError, match="--canary-data"):
        ship_canary(writer, source, seed=0)


@pytest.mark.parametrize("flag", ["--canary-data", "--blocks-data"])
def test_bad_labelled_data_is_refused_before_any_work(tmp_path: Path, flag: str) -> None:
    """Both files were read only after the adaptable graphs or the blocks had been exported (~30-90 s
    on the demo bundle); now before the inputs are even opened (these do not exist)."""
    from hmt.deploy import DeployOptions, deploy_bundle

    bad = tmp_path / "labelled.npz"
    np.savez(bad, x=np.zeros((4, 3, 8, 8), np.float32))  # no y
    options = DeployOptions(target="x86-64", engines=("onnxruntime",), adaptable=flag == "--canary-data",
                            canary_data=bad if flag == "--canary-data" else None, blocks=flag == "--blocks-data",
                            blocks_data=bad if flag == "--blocks-data" else None)
    with pytest.raises(UsageError, match=f"^{flag} .*labelled.npz: expected an .npz"):
        deploy_bundle(tmp_path / "no-fused", tmp_path / "no-pareto", tmp_path / "out", options=options)


def test_an_npz_whose_header_declares_a_huge_array_is_bad_input(tmp_path: Path) -> None:
    """numpy allocates an .npz member's array from its header before reading a byte: a 600-byte file
    asked for 10 PiB and the MemoryError was an internal error (exit 70) in serve --data, --canary,
    deploy --blocks-data and --canary-data."""
    import io
    import zipfile

    from hmt.deploy.adaptable import read_canary

    def member(shape: tuple[int, ...], dtype: str) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
        return buf.getvalue() + bytes(64)

    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w") as archive:
        archive.writestr("x.npy", member((10**12, 3, 32, 32), "<f4"))
        archive.writestr("y.npy", member((10**12,), "<i8"))
    with pytest.raises(UsageError, match="--canary-data .*bomb.npz: expected an .npz"):
        read_canary(bomb)


@pytest.mark.parametrize(("y", "classes"), [(np.arange(1, 5), 4), (np.array([0, 1, -1, 2]), None)])
def test_blocks_data_labels_outside_the_classes_are_refused(tmp_path: Path, y: np.ndarray, classes: int | None) -> None:
    """1-based labels (or another dataset's) were shipped as they were: every variant scored 0 % on them, in
    blocks.json and in re-search, whose accuracy floor then let any candidate through."""
    from hmt.deploy.blocks import read_labelled

    source = tmp_path / "labelled.npz"
    np.savez(source, x=np.zeros((4, 3, 8, 8), np.float32), y=y)
    with pytest.raises(UsageError, match="--blocks-data .*labelled.npz: y must be class indices 0"):
        read_labelled(source, (3, 8, 8), seed=0, max_samples=8, num_classes=classes)


def test_blocks_data_labels_within_the_classes_ship(tmp_path: Path) -> None:
    from hmt.deploy.blocks import read_labelled

    source = tmp_path / "labelled.npz"
    np.savez(source, x=np.zeros((4, 3, 8, 8), np.float32), y=np.arange(4))
    assert read_labelled(source, (3, 8, 8), seed=0, max_samples=8, num_classes=4)[1].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("labels", "message"), [(np.array([1, 2, 10]), "0..9, got 1..10"),
                                                 (np.array([-1, 0, 3]), "0..9, got -1..3")])
def test_canary_labels_outside_the_classes_are_refused(tmp_path: Path, labels: np.ndarray, message: str) -> None:
    """Shipped as given, 1-based or another dataset's labels made serve --adapt refuse the bundle at start,
    on the device; deploy refuses them, naming the file and the range (negative ones before any work)."""
    from hmt.deploy.adaptable import read_canary

    source = tmp_path / "canary.npz"
    np.savez(source, x=np.zeros((3, 3, 4, 4), np.float32), y=labels)
    with ArtifactWriter(tmp_path / "bundle", kind="bundle", config={}) as writer, \
            pytest.raises(UsageError, match=f"--canary-data .*canary.npz: y must be class indices {message}"):
        ship_canary(writer, source, seed=0, num_classes=10)
    if labels.min() < 0:
        with pytest.raises(UsageError, match="class indices 0 or more"):
            read_canary(source)
    else:
        assert len(read_canary(source)[1]) == 3  # before the classes are known: only the sign
