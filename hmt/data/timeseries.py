"""BasicMotions in the sktime ``.ts`` text format.

A file has ``#`` comment lines, ``@`` header lines (``@dimensions``, ``@seriesLength``,
``@classLabel true A B ...``, ``@data``) and then one sample a line: each channel's
comma-separated values, channels joined by ``:``, the class label last.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hmt.data.source import Source
from hmt.data.types import Dataset, DatasetInfo
from hmt.errors import InputError
from hmt.progress import ProgressCallback

BASICMOTIONS_FILES = {"train": "BasicMotions_TRAIN.ts", "test": "BasicMotions_TEST.ts"}
BASICMOTIONS_CLASSES: tuple[str, ...] = ("Standing", "Running", "Walking", "Badminton")
BASICMOTIONS_CHANNELS = 6
BASICMOTIONS_STEPS = 100


def _header_int(headers: dict[str, str], key: str, default: int, path: Path) -> int:
    if key not in headers:
        return default
    try:
        return int(headers[key])
    except ValueError:
        raise InputError(f"{path}: header @{key} {headers[key]!r}; expected an integer") from None


def parse_ts(path: Path) -> tuple[np.ndarray, list[tuple[int, str]], tuple[str, ...]]:
    """Values float32 (N, C, L), (line number, label) of each row, and the header's class labels.

    Every row must have the channel count and length the header declares (or, when it
    declares none, the first row's), and a label the header lists.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read as UTF-8 text ({exc})") from exc
    headers: dict[str, str] = {}
    in_data = False
    rows: list[np.ndarray] = []
    labels: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            if not line.startswith("@"):
                raise InputError(f"{path}: line {number} comes before @data; expected a # or @ header line")
            key, _, value = line[1:].partition(" ")
            headers[key.lower()] = value.strip()
            in_data = key.lower() == "data"
            continue
        parts = line.split(":")
        channels = _header_int(headers, "dimensions", len(parts) - 1, path)
        if len(parts) != channels + 1:
            raise InputError(
                f"{path}: line {number} has {len(parts) - 1} channels; "
                f"expected {channels} then the label, joined by ':'"
            )
        try:
            values = np.array([[float(v) for v in part.split(",")] for part in parts[:-1]], dtype=np.float32)
        except ValueError as exc:
            raise InputError(f"{path}: line {number}: channels must be equal-length lists of numbers ({exc})") from exc
        length = _header_int(headers, "serieslength", values.shape[1], path)
        if values.shape[1] != length:
            raise InputError(f"{path}: line {number} has series of {values.shape[1]} steps; expected {length}")
        if not np.isfinite(values).all():
            raise InputError(f"{path}: line {number} holds a missing or infinite value")
        rows.append(values)
        labels.append((number, parts[-1].strip()))
    class_tokens = headers.get("classlabel", "").split()
    if not class_tokens or class_tokens[0].lower() != "true":
        raise InputError(f"{path}: no '@classLabel true <labels...>' header; expected a labelled .ts file")
    if not rows:
        raise InputError(f"{path}: holds no data rows after @data")
    return np.stack(rows), labels, tuple(class_tokens[1:])


def resolve_basicmotions(path: Path) -> Source:
    if not path.is_dir():
        raise InputError(f"{path}: not a folder; expected one holding {' and '.join(BASICMOTIONS_FILES.values())}")
    files = {split: path / name for split, name in BASICMOTIONS_FILES.items()}
    for file in files.values():
        if not file.is_file():
            raise InputError(f"{file}: missing; expected the BasicMotions .ts files side by side in {path}")

    def decode(sha256: str, progress: ProgressCallback) -> Dataset:
        parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for split, file in files.items():
            values, labels, declared = parse_ts(file)
            if set(declared) != set(BASICMOTIONS_CLASSES):
                raise InputError(f"{file}: @classLabel lists {declared}; expected {BASICMOTIONS_CLASSES}")
            if values.shape[1:] != (BASICMOTIONS_CHANNELS, BASICMOTIONS_STEPS):
                raise InputError(
                    f"{file}: samples are {values.shape[1]} channels x {values.shape[2]} steps; "
                    f"expected {BASICMOTIONS_CHANNELS} x {BASICMOTIONS_STEPS}"
                )
            for number, label in labels:
                if label not in BASICMOTIONS_CLASSES:
                    raise InputError(f"{file}: line {number} has label {label!r}; expected one of {declared}")
            y = np.array([BASICMOTIONS_CLASSES.index(label) for _, label in labels], dtype=np.int64)
            parts[split] = (values, y)
        train_x = parts["train"][0]
        info = DatasetInfo(
            name="basicmotions",
            modality="sequence",
            input_shape=(BASICMOTIONS_CHANNELS, BASICMOTIONS_STEPS),
            num_classes=len(BASICMOTIONS_CLASSES),
            class_names=BASICMOTIONS_CLASSES,
            mean=tuple(float(v) for v in train_x.mean(axis=(0, 2), dtype=np.float64)),
            std=tuple(float(v) for v in train_x.std(axis=(0, 2), dtype=np.float64)),
            source=str(path),
            source_sha256=sha256,
        )
        return Dataset(info, *parts["train"], *parts["test"])

    return Source("basicmotions", str(path), [(name, files[s]) for s, name in BASICMOTIONS_FILES.items()], decode)
