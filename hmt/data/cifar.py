"""CIFAR-10 readers: the shared JPEG zips, an unzipped image folder, the python batches.

All three give the same layout: uint8 ``(N, 3, 32, 32)`` in the usual class order, the
samples of each split sorted by (class, file name) so that the arrays do not depend
on the order entries happen to have in an archive or a directory listing.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path

import numpy as np

from hmt.data.safe_pickle import safe_load_pickle
from hmt.data.source import Source
from hmt.data.types import Dataset, DatasetInfo
from hmt.errors import InputError
from hmt.progress import ProgressCallback

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
# The normalisation the pretrained CIFAR ResNets in shared/models were trained with
# (akamaster/pytorch_resnet_cifar10 uses the ImageNet constants). Fine-tuning those
# models only keeps their accuracy if inputs are normalised the same way, so every
# CIFAR-10 source uses these rather than statistics of its own pixels.
CIFAR10_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
CIFAR10_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
IMAGE_SIZE_PX = 32
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_BATCH_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
_TEST_BATCH = "test_batch"
_PROGRESS_EVERY = 2000
EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"

_LAYOUTS_EXPECTED = (
    "expected one of: a folder holding train.zip and test.zip (entries train/<class>/NNNN.jpg); "
    "an image-folder root with train/<class>/*.jpg and test/<class>/*.jpg; "
    "the CIFAR-10 python batches (data_batch_1..5 and test_batch, or a cifar-10-batches-py folder)"
)


def _info(source: str, sha256: str) -> DatasetInfo:
    return DatasetInfo(
        name="cifar10",
        modality="image",
        input_shape=(3, IMAGE_SIZE_PX, IMAGE_SIZE_PX),
        num_classes=len(CIFAR10_CLASSES),
        class_names=CIFAR10_CLASSES,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
        source=source,
        source_sha256=sha256,
    )


def _skippable(name: str) -> bool:
    # Metadata that archivers add and that is never a sample.
    base = name.rsplit("/", 1)[-1]
    return name.endswith("/") or base.startswith(".") or name.startswith("__MACOSX/")


def _label_of(split: str, relative: str, where: str) -> int:
    """Class index of ``<split>/<class>/<file>``; InputError for anything else."""
    parts = relative.split("/")
    if len(parts) != 3 or parts[0] != split:
        raise InputError(f"{where}: entry {relative!r} is not {split}/<class>/<file>")
    if parts[1] not in CIFAR10_CLASSES:
        raise InputError(
            f"{where}: entry {relative!r} is in unknown class folder {parts[1]!r}; "
            f"expected one of {', '.join(CIFAR10_CLASSES)}"
        )
    if not parts[2].lower().endswith(_IMAGE_SUFFIXES):
        raise InputError(f"{where}: entry {relative!r} is not an image file ({', '.join(_IMAGE_SUFFIXES)})")
    return CIFAR10_CLASSES.index(parts[1])


def decode_images(
    entries: list[tuple[int, str, bytes]], where: str, progress: ProgressCallback, task: str
) -> tuple[np.ndarray, np.ndarray]:
    """Decode (label, entry name, encoded bytes) into uint8 (N, 3, 32, 32) and int64 labels."""
    from PIL import Image

    ordered = sorted(entries, key=lambda e: (e[0], e[1]))
    images = np.empty((len(ordered), IMAGE_SIZE_PX, IMAGE_SIZE_PX, 3), dtype=np.uint8)
    for k, (_, name, blob) in enumerate(ordered):
        try:
            with Image.open(io.BytesIO(blob)) as image:
                if image.size != (IMAGE_SIZE_PX, IMAGE_SIZE_PX) or image.mode != "RGB":
                    raise InputError(
                        f"{where}: entry {name!r} is a {image.size[0]}x{image.size[1]} {image.mode} image; "
                        f"expected {IMAGE_SIZE_PX}x{IMAGE_SIZE_PX} RGB"
                    )
                images[k] = np.asarray(image)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise InputError(f"{where}: entry {name!r} is not a decodable image ({exc})") from exc
        if (k + 1) % _PROGRESS_EVERY == 0:
            progress(task, k + 1, len(ordered))
    labels = np.fromiter((e[0] for e in ordered), dtype=np.int64, count=len(ordered))
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)), labels


def _read_zip(path: Path, split: str) -> list[tuple[int, str, bytes]]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise InputError(
            f"{path}: not a readable zip archive ({exc}); expected {split}/<class>/NNNN.jpg entries"
        ) from exc
    entries: list[tuple[int, str, bytes]] = []
    with archive:
        for member in archive.infolist():
            if _skippable(member.filename):
                continue
            label = _label_of(split, member.filename, str(path))
            try:
                entries.append((label, member.filename, archive.read(member)))
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as exc:
                raise InputError(f"{path}: entry {member.filename!r} is corrupt or truncated ({exc})") from exc
    if not entries:
        raise InputError(f"{path}: holds no images; expected {split}/<class>/NNNN.jpg entries")
    return entries


def _read_folder(root: Path, split: str) -> list[tuple[int, str, bytes]]:
    split_dir = root / split
    entries: list[tuple[int, str, bytes]] = []
    for path in sorted(p for p in split_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if _skippable(relative):
            continue
        label = _label_of(split, relative, str(root))
        try:
            entries.append((label, relative, path.read_bytes()))
        except OSError as exc:
            raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if not entries:
        raise InputError(f"{split_dir}: holds no images; expected {split}/<class>/*.jpg")
    return entries


def _zip_source(folder: Path, display: str) -> Source:
    zips = {split: folder / f"{split}.zip" for split in ("train", "test")}

    def decode(sha256: str, progress: ProgressCallback) -> Dataset:
        parts = {}
        for split, path in zips.items():
            parts[split] = decode_images(_read_zip(path, split), str(path), progress, f"decode cifar10 {split}")
        return Dataset(_info(display, sha256), *parts["train"], *parts["test"])

    return Source("cifar10", display, [(f"{s}.zip", p) for s, p in zips.items()], decode)


def _folder_source(root: Path) -> Source:
    files = [
        (p.relative_to(root).as_posix(), p)
        for split in ("train", "test")
        for p in sorted((root / split).rglob("*"))
        if p.is_file() and not _skippable(p.relative_to(root).as_posix())
    ]

    def decode(sha256: str, progress: ProgressCallback) -> Dataset:
        parts = {}
        for split in ("train", "test"):
            parts[split] = decode_images(_read_folder(root, split), str(root), progress, f"decode cifar10 {split}")
        return Dataset(_info(str(root), sha256), *parts["train"], *parts["test"])

    return Source("cifar10", str(root), files, decode)


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = safe_load_pickle(path)
    if not isinstance(batch, dict):
        raise InputError(f"{path}: holds a {type(batch).__name__}; expected a dict with b'data' and b'labels'")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    pixels = IMAGE_SIZE_PX * IMAGE_SIZE_PX * 3
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != pixels:
        shape = getattr(data, "shape", None)
        raise InputError(f"{path}: b'data' is {type(data).__name__} {shape}; expected a uint8 array (N, {pixels})")
    if not isinstance(labels, list) or len(labels) != data.shape[0] or not all(type(v) is int for v in labels):
        raise InputError(f"{path}: b'labels' must be a list of {data.shape[0]} ints")
    y = np.asarray(labels, dtype=np.int64)
    if y.size and (y.min() < 0 or y.max() >= len(CIFAR10_CLASSES)):
        raise InputError(f"{path}: labels span {y.min()}..{y.max()}; expected 0..{len(CIFAR10_CLASSES) - 1}")
    # Rows are 1024 red, then green, then blue values in row-major order: already CHW.
    return np.ascontiguousarray(data.reshape(-1, 3, IMAGE_SIZE_PX, IMAGE_SIZE_PX)), y


def _batches_source(folder: Path) -> Source:
    train_files = [folder / name for name in _BATCH_FILES]
    test_file = folder / _TEST_BATCH
    missing = [p.name for p in [*train_files, test_file] if not p.is_file()]
    if missing:
        raise InputError(f"{folder}: CIFAR-10 python batches incomplete, missing {', '.join(missing)}")

    def decode(sha256: str, progress: ProgressCallback) -> Dataset:
        train = [_read_batch(p) for p in train_files]
        test_x, test_y = _read_batch(test_file)
        train_x = np.concatenate([x for x, _ in train])
        train_y = np.concatenate([y for _, y in train])
        return Dataset(_info(str(folder), sha256), train_x, train_y, test_x, test_y)

    return Source("cifar10", str(folder), [(p.name, p) for p in [*train_files, test_file]], decode)


def resolve_cifar10(path: Path | None) -> Source:
    """Find which CIFAR-10 layout ``path`` holds (None: the embedded subset)."""
    if path is None:
        return _zip_source(EMBEDDED_DIR, "embedded")
    if not path.is_dir():
        raise InputError(f"{path}: not a folder; {_LAYOUTS_EXPECTED}")
    if (path / "train.zip").is_file() or (path / "test.zip").is_file():
        for split in ("train", "test"):
            if not (path / f"{split}.zip").is_file():
                raise InputError(f"{path}: has no {split}.zip beside the other split's zip")
        return _zip_source(path, str(path))
    if (path / "train").is_dir() and (path / "test").is_dir():
        return _folder_source(path)
    for folder in (path, path / "cifar-10-batches-py"):
        if (folder / _BATCH_FILES[0]).is_file() or (folder / _TEST_BATCH).is_file():
            return _batches_source(folder)
    raise InputError(f"{path}: no CIFAR-10 data found; {_LAYOUTS_EXPECTED}")
