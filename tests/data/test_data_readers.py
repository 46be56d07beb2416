"""Each reader on real data, and each refusing malformed input with a useful InputError."""

from __future__ import annotations

import gzip
import io
import pickle
import shutil
import wave
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hmt.data import DATASET_KINDS, Dataset, load_dataset, log_mel_features
from hmt.data.cifar import CIFAR10_CLASSES, EMBEDDED_DIR
from hmt.errors import InputError, UsageError


def _assert_balanced(y: np.ndarray, classes: int, per_class: int) -> None:
    assert np.bincount(y, minlength=classes).tolist() == [per_class] * classes


def test_embedded_cifar(embedded_cifar: Dataset) -> None:
    ds = embedded_cifar
    assert ds.info.name == "cifar10" and ds.info.modality == "image"
    assert ds.info.source == "embedded" and len(ds.info.source_sha256) == 64
    assert ds.info.input_shape == (3, 32, 32) and ds.info.class_names == CIFAR10_CLASSES
    assert ds.train_x.shape == (2000, 3, 32, 32) and ds.train_x.dtype == np.uint8
    assert ds.test_x.shape == (1000, 3, 32, 32) and ds.test_y.dtype == np.int64
    _assert_balanced(ds.train_y, 10, 200)
    _assert_balanced(ds.test_y, 10, 100)
    assert 40 < ds.train_x.mean() < 200  # real pixels, not zeros


def test_embedded_subset_is_small() -> None:
    total = sum(p.stat().st_size for p in EMBEDDED_DIR.iterdir())
    assert total < 4_000_000
    assert (EMBEDDED_DIR / "PROVENANCE.md").is_file()


def test_mnist(mnist: Dataset) -> None:
    info = mnist.info
    assert mnist.train_x.shape == (4000, 1, 28, 28) and mnist.test_x.shape == (1000, 1, 28, 28)
    _assert_balanced(mnist.test_y, 10, 100)  # stratified 80/20 of 500 per class
    assert "20240501" in info.test_split and "stratified" in info.test_split
    assert info.source_sha256 == "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
    assert info.mean[0] == pytest.approx(mnist.train_x.mean() / 255, rel=1e-6)


def test_basicmotions(basicmotions: Dataset) -> None:
    info = basicmotions.info
    assert info.modality == "sequence" and info.input_shape == (6, 100)
    assert info.class_names == ("Standing", "Running", "Walking", "Badminton")
    assert basicmotions.train_x.shape == (40, 6, 100) and basicmotions.train_x.dtype == np.float32
    _assert_balanced(basicmotions.train_y, 4, 10)
    np.testing.assert_allclose(info.mean, basicmotions.train_x.mean(axis=(0, 2)), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(info.std, basicmotions.train_x.std(axis=(0, 2)), rtol=1e-4)


def test_fsdd(fsdd: Dataset) -> None:
    info = fsdd.info
    assert info.input_shape == (40, 101) and info.modality == "sequence"
    # 6 speakers x 10 digits, recordings 0-4 of each are the test split.
    assert fsdd.test_x.shape == (300, 40, 101) and fsdd.train_x.shape == (2700, 40, 101)
    _assert_balanced(fsdd.test_y, 10, 30)
    assert "0-4" in info.test_split
    assert np.isfinite(fsdd.train_x).all()


def test_log_mel_of_a_tone_peaks_at_its_band() -> None:
    t = np.arange(8000) / 8000
    low = log_mel_features(np.sin(2 * np.pi * 300 * t).astype(np.float32))
    high = log_mel_features(np.sin(2 * np.pi * 3000 * t).astype(np.float32))
    assert low.shape == (40, 101) and low.dtype == np.float32
    assert low.mean(axis=1).argmax() < high.mean(axis=1).argmax()


def test_unknown_kind_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown dataset kind"):
        load_dataset("imagenet")
    for kind in DATASET_KINDS[1:]:
        with pytest.raises(UsageError, match="no embedded copy"):
            load_dataset(kind)
    with pytest.raises(InputError, match="does not exist"):
        load_dataset("mnist", tmp_path / "nope.csv.gz")
    with pytest.raises(InputError, match="no CIFAR-10 data found"):
        load_dataset("cifar10", tmp_path, cache_dir=tmp_path)


# -- CIFAR-10 layouts -------------------------------------------------------------


def _jpeg(size: tuple[int, int] = (32, 32), mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 128).save(out, format="JPEG")
    return out.getvalue()


def _write_zip(path: Path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, blob in entries.items():
            archive.writestr(name, blob)


def _tiny_cifar_zips(folder: Path, train_extra: dict[str, bytes] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    _write_zip(folder / "train.zip", {"train/cat/0000.jpg": _jpeg(), **(train_extra or {})})
    _write_zip(folder / "test.zip", {"test/dog/0000.jpg": _jpeg()})
    return folder


@pytest.mark.parametrize(("held", "files", "read_as"), [
    ("basicmotions", ["BasicMotions_TRAIN.ts", "BasicMotions_TEST.ts"], "cifar10"),
    ("fsdd", ["recordings.zip"], "basicmotions"),
    ("mnist", ["mnist_5k.csv.gz"], "fsdd"),
])
def test_a_folder_of_another_kind_names_the_flag(tmp_path: Path, held: str, files: list[str], read_as: str) -> None:
    # The default kind is cifar10: a user passing --data of another kind without --dataset is
    # told which kind the folder holds, not only what CIFAR-10 layouts are accepted.
    for name in files:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(InputError, match=f"holds {held} data, not {read_as}; pass --dataset {held}"):
        load_dataset(read_as, tmp_path, cache_dir=tmp_path / "cache")


def test_cifar_truncated_zip_names_file(tmp_path: Path) -> None:
    shutil.copy(EMBEDDED_DIR / "test.zip", tmp_path / "test.zip")
    blob = (EMBEDDED_DIR / "train.zip").read_bytes()
    (tmp_path / "train.zip").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputError, match=r"train\.zip.*not a readable zip"):
        load_dataset("cifar10", tmp_path, cache_dir=tmp_path / "cache")


def test_cifar_corrupt_entry_names_entry(tmp_path: Path) -> None:
    folder = _tiny_cifar_zips(tmp_path / "src")
    blob = bytearray((folder / "train.zip").read_bytes())
    jpeg = _jpeg()
    at = bytes(blob).index(jpeg) + len(jpeg) // 2
    blob[at] ^= 0xFF  # stored entry: the flipped byte fails the CRC-32
    (folder / "train.zip").write_bytes(bytes(blob))
    with pytest.raises(InputError, match=r"train\.zip: entry 'train/cat/0000\.jpg' is corrupt"):
        load_dataset("cifar10", folder, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"train/cat/0001.jpg": _jpeg((31, 32))}, r"0001\.jpg' is a 31x32 RGB image; expected 32x32 RGB"),
        ({"train/cat/0001.jpg": _jpeg(mode="L")}, r"0001\.jpg' is a 32x32 L image"),
        ({"train/kitten/0001.jpg": _jpeg()}, r"unknown class folder 'kitten'"),
        ({"train/cat/0001.jpg": b"not a jpeg"}, r"0001\.jpg' is not a decodable image"),
        ({"train/cat/notes.txt": b"x"}, r"not an image file"),
        ({"cat/0001.jpg": _jpeg()}, r"is not train/<class>/<file>"),
    ],
)
def test_cifar_bad_entries(tmp_path: Path, extra: dict[str, bytes], message: str) -> None:
    folder = _tiny_cifar_zips(tmp_path / "src", extra)
    with pytest.raises(InputError, match=message) as caught:
        load_dataset("cifar10", folder, cache_dir=tmp_path / "cache")
    assert "train.zip" in str(caught.value)


def test_cifar_image_folder_matches_zip(tmp_path: Path, embedded_cifar: Dataset) -> None:
    for split in ("train", "test"):
        with zipfile.ZipFile(EMBEDDED_DIR / f"{split}.zip") as archive:
            archive.extractall(tmp_path / "root")
    ds = load_dataset("cifar10", tmp_path / "root", cache_dir=tmp_path / "cache")
    assert ds.info.source == str(tmp_path / "root")
    np.testing.assert_array_equal(ds.train_x, embedded_cifar.train_x)
    np.testing.assert_array_equal(ds.test_y, embedded_cifar.test_y)


def _write_batches(folder: Path, rng: np.random.Generator, per_batch: int = 6) -> tuple[np.ndarray, np.ndarray]:
    folder.mkdir(parents=True)
    xs, ys = [], []
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": [b"x.png"] * per_batch}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        xs.append(data)
        ys.append(labels)
    return np.concatenate(xs), np.concatenate(ys)


def test_cifar_python_batches(tmp_path: Path) -> None:
    x, y = _write_batches(tmp_path / "cifar-10-batches-py", np.random.default_rng(0))
    ds = load_dataset("cifar10", tmp_path, cache_dir=tmp_path / "cache")
    assert ds.train_x.shape == (30, 3, 32, 32) and ds.test_x.shape == (6, 3, 32, 32)
    np.testing.assert_array_equal(ds.train_x.reshape(30, -1), x[:30])
    np.testing.assert_array_equal(ds.test_y, y[30:])
    # Row layout is 1024 red, 1024 green, 1024 blue: channel 1 starts at value 1024.
    assert ds.train_x[0, 1, 0, 0] == x[0, 1024]


def test_cifar_python_batches_refuse_malicious_pickle(tmp_path: Path) -> None:
    folder = tmp_path / "batches"
    _write_batches(folder, np.random.default_rng(0))
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, (f"touch {marker}",))

    (folder / "data_batch_3").write_bytes(pickle.dumps({b"data": Payload()}, protocol=2))
    with pytest.raises(InputError, match=r"data_batch_3: pickle refers to (posix|os|nt)\.system"):
        load_dataset("cifar10", folder, cache_dir=tmp_path / "cache")
    assert not marker.exists()


# -- MNIST, BasicMotions, FSDD malformed input --------------------------------------


def test_mnist_malformed_row_names_line(tmp_path: Path) -> None:
    good = ",".join(["0"] * 784 + ["3"])
    short = ",".join(["0"] * 783 + ["3"])
    path = tmp_path / "mnist_5k.csv.gz"
    path.write_bytes(gzip.compress(f"{good}\n{short}\n".encode()))
    with pytest.raises(InputError, match=r"mnist_5k\.csv\.gz: line 2 has 784 values; expected 785"):
        load_dataset("mnist", path, cache_dir=tmp_path / "cache")
    path.write_bytes(gzip.compress(f"{good}\n{good[:-1]}x\n".encode()))
    with pytest.raises(InputError, match=r"line 2 holds a non-integer"):
        load_dataset("mnist", path, cache_dir=tmp_path / "cache")
    path.write_bytes(b"not gzip")
    with pytest.raises(InputError, match="not a readable gzipped"):
        load_dataset("mnist", path, cache_dir=tmp_path / "cache")


def test_basicmotions_malformed_line_names_line(tmp_path: Path, shared_datasets: Path) -> None:
    source = shared_datasets / "basicmotions"
    for name in ("BasicMotions_TRAIN.ts", "BasicMotions_TEST.ts"):
        shutil.copy(source / name, tmp_path / name)
    lines = (tmp_path / "BasicMotions_TEST.ts").read_text().splitlines()
    first_data = next(i for i, line in enumerate(lines) if line and line[0] not in "#@")
    broken = lines.copy()
    broken[first_data] = broken[first_data].split(":", 1)[1]  # drop one channel
    (tmp_path / "BasicMotions_TEST.ts").write_text("\n".join(broken) + "\n")
    with pytest.raises(InputError, match=rf"BasicMotions_TEST\.ts: line {first_data + 1} has 5 channels; expected 6"):
        load_dataset("basicmotions", tmp_path, cache_dir=tmp_path / "cache")
    broken = lines.copy()
    broken[first_data] = broken[first_data].rsplit(":", 1)[0] + ":Jogging"
    (tmp_path / "BasicMotions_TEST.ts").write_text("\n".join(broken) + "\n")
    with pytest.raises(InputError, match=rf"line {first_data + 1} has label 'Jogging'"):
        load_dataset("basicmotions", tmp_path, cache_dir=tmp_path / "cache")


def _wav(rate_hz: int = 8000, samples: int = 4000, channels: int = 1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(rate_hz)
        tone = (8000 * np.sin(np.arange(samples * channels) / 5)).astype("<i2")
        writer.writeframes(tone.tobytes())
    return out.getvalue()


def test_fsdd_folder_and_bad_wav(tmp_path: Path) -> None:
    folder = tmp_path / "recordings"
    folder.mkdir()
    for digit in range(10):
        for index in (0, 7):
            (folder / f"{digit}_alice_{index}.wav").write_bytes(_wav(samples=3000 + 2000 * index))
    ds = load_dataset("fsdd", tmp_path, cache_dir=tmp_path / "cache")
    assert ds.train_x.shape == (10, 40, 101) and ds.test_x.shape == (10, 40, 101)
    assert ds.train_y.tolist() == list(range(10))
    (folder / "3_alice_9.wav").write_bytes(_wav(rate_hz=16000))
    with pytest.raises(InputError, match=r"3_alice_9\.wav.*16000 Hz; expected mono 16-bit PCM at 8000 Hz"):
        load_dataset("fsdd", tmp_path, cache_dir=tmp_path / "cache")
    (folder / "3_alice_9.wav").unlink()
    (folder / "three_alice_9.wav").write_bytes(_wav())
    with pytest.raises(InputError, match=r"three_alice_9\.wav' is not named <digit>_<speaker>_<index>\.wav"):
        load_dataset("fsdd", tmp_path, cache_dir=tmp_path / "cache")


def test_fsdd_truncated_zip(tmp_path: Path, fsdd_dir: Path) -> None:
    blob = (fsdd_dir / "recordings.zip").read_bytes()
    (tmp_path / "recordings.zip").write_bytes(blob[:100_000])
    with pytest.raises(InputError, match=r"recordings\.zip: not a readable zip"):
        load_dataset("fsdd", tmp_path / "recordings.zip", cache_dir=tmp_path / "cache")
