"""MNIST from the shared 5,000-digit CSV (784 pixels then the label on each row)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from hmt.data.source import Source
from hmt.data.split import stratified_indices
from hmt.data.types import Dataset, DatasetInfo
from hmt.errors import InputError
from hmt.progress import ProgressCallback

MNIST_FILE = "mnist_5k.csv.gz"
MNIST_SIDE_PX = 28
MNIST_TEST_FRACTION = 0.2
# The CSV has no test split; this seed fixes the one drawn here, and it is part of
# the cache key and of info.test_split, so results stay comparable across runs.
MNIST_SPLIT_SEED = 20_240_501
_ROW_VALUES = MNIST_SIDE_PX * MNIST_SIDE_PX + 1


def _parse_rows(path: Path, text: str) -> tuple[np.ndarray, np.ndarray]:
    rows: list[np.ndarray] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != _ROW_VALUES:
            raise InputError(
                f"{path}: line {number} has {len(parts)} values; expected {_ROW_VALUES} (784 pixels, label)"
            )
        try:
            row = np.array([int(v) for v in parts], dtype=np.int64)
        except ValueError as exc:
            raise InputError(f"{path}: line {number} holds a non-integer value ({exc})") from exc
        if row[:-1].min() < 0 or row[:-1].max() > 255:
            raise InputError(f"{path}: line {number} has a pixel outside 0..255")
        if not 0 <= row[-1] <= 9:
            raise InputError(f"{path}: line {number} has label {row[-1]}; expected a digit 0..9")
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: holds no rows; expected {_ROW_VALUES} integers a row")
    table = np.stack(rows)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 1, MNIST_SIDE_PX, MNIST_SIDE_PX)
    return images, table[:, -1]


def resolve_mnist(path: Path) -> Source:
    file = path / MNIST_FILE if path.is_dir() else path
    if not file.is_file():
        raise InputError(f"{path}: no {MNIST_FILE} found; expected the gzipped CSV or the folder holding it")

    def decode(sha256: str, progress: ProgressCallback) -> Dataset:
        try:
            text = gzip.decompress(file.read_bytes()).decode("ascii")
        except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise InputError(f"{file}: not a readable gzipped ASCII CSV ({exc})") from exc
        images, labels = _parse_rows(file, text)
        train_idx, test_idx = stratified_indices(labels, MNIST_TEST_FRACTION, np.random.default_rng(MNIST_SPLIT_SEED))
        train_x = images[train_idx]
        pixels = train_x.astype(np.float64) / 255.0
        info = DatasetInfo(
            name="mnist",
            modality="image",
            input_shape=(1, MNIST_SIDE_PX, MNIST_SIDE_PX),
            num_classes=10,
            class_names=tuple(str(d) for d in range(10)),
            mean=(float(pixels.mean()),),
            std=(float(pixels.std()),),
            source=str(file),
            source_sha256=sha256,
            test_split=(
                f"stratified {1 - MNIST_TEST_FRACTION:.0%}/{MNIST_TEST_FRACTION:.0%} split of the CSV rows, "
                f"numpy default_rng({MNIST_SPLIT_SEED})"
            ),
        )
        return Dataset(info, train_x, labels[train_idx], images[test_idx], labels[test_idx])

    params = {"test_fraction": MNIST_TEST_FRACTION, "split_seed": MNIST_SPLIT_SEED}
    return Source("mnist", str(file), [(MNIST_FILE, file)], decode, params)
