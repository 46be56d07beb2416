"""``load_dataset``: locate a source, then serve it from the cache or decode and cache it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from hmt.data.cache import cache_key, cache_path, default_cache_dir, load_cached, sha256_files, store_cached
from hmt.data.source import Source
from hmt.data.types import DATASET_KINDS, Dataset, DatasetInfo
from hmt.errors import InputError, UsageError
from hmt.progress import ProgressCallback, no_progress


def _resolver(kind: str) -> Callable[[Path | None], Source]:
    # Imported on demand: each reader pulls in only what its format needs (PIL, wave).
    if kind == "cifar10":
        from hmt.data.cifar import resolve_cifar10

        return resolve_cifar10

    def needs_path(path: Path | None) -> Source:
        if path is None:
            raise UsageError(f"dataset {kind!r} has no embedded copy; pass the path to its files")
        if kind == "mnist":
            from hmt.data.mnist import resolve_mnist

            return resolve_mnist(path)
        if kind == "basicmotions":
            from hmt.data.timeseries import resolve_basicmotions

            return resolve_basicmotions(path)
        from hmt.data.audio import resolve_fsdd

        return resolve_fsdd(path)

    return needs_path


# A file or folder that only one dataset kind's files are named (see each reader), to say which
# kind a path holds when it is read as another.
_SIGNATURE_NAMES = {
    "cifar10": ("train.zip", "cifar-10-batches-py", "data_batch_1"),
    "mnist": ("mnist_5k.csv.gz",),
    "basicmotions": ("BasicMotions_TRAIN.ts",),
    "fsdd": ("recordings.zip", "recordings"),
}


def held_kind(path: Path) -> str | None:
    """The dataset kind whose files ``path`` holds (or is), by their names; None if none."""
    for kind, names in _SIGNATURE_NAMES.items():
        if path.name in names or (path.is_dir() and any((path / name).exists() for name in names)):
            return kind
    return None


def _resolve(kind: str, path: Path | None) -> Source:
    """``kind``'s source at ``path``; a refusal names the kind the path holds, when it holds another."""
    try:
        return _resolver(kind)(path)
    except InputError as exc:
        other = None if path is None else held_kind(path)
        if other is None or other == kind:
            raise
        raise InputError(f"{path}: holds {other} data, not {kind}; pass --dataset {other}") from exc


def load_dataset(
    kind: str,
    path: Path | None = None,
    *,
    cache_dir: Path | None = None,
    use_cache: bool = True,
    progress: ProgressCallback = no_progress,
) -> Dataset:
    """Read a dataset; the decoded arrays are cached, keyed by the sha256 of the source.

    ``kind`` is one of ``DATASET_KINDS``. ``path`` locates the source (see each reader;
    ``None`` means the embedded CIFAR-10 subset, the only embedded one). ``cache_dir``
    defaults to ``default_cache_dir()``. A cache entry that fails its checks is rebuilt;
    a cache that cannot be written costs speed, not the load (a RuntimeWarning says so).
    Raises ``UsageError`` for an unknown kind, ``InputError`` for a missing, corrupt or
    malformed source, naming the file (and entry or line) and what was expected.
    """
    if kind not in DATASET_KINDS:
        raise UsageError(f"unknown dataset kind {kind!r}; expected one of {', '.join(DATASET_KINDS)}")
    if path is not None:
        path = Path(path).expanduser()
        if not path.exists():
            raise InputError(f"{path}: does not exist; expected the {kind} dataset there")
    source = _resolve(kind, path)
    if not source.files:
        raise InputError(f"{source.display}: holds no {kind} files")
    try:
        sha256 = sha256_files(source.files)
    except OSError as exc:
        raise InputError(f"{source.display}: cannot read a source file ({exc})") from exc
    entry = None
    if use_cache:
        key = cache_key(kind, sha256, source.params)
        entry = cache_path(cache_dir if cache_dir is not None else default_cache_dir(), kind, key)
        hit = load_cached(entry, key)
        if hit is not None:
            arrays, info_dict = hit
            try:
                # The key is content-based: the same files at another path are a hit, so the
                # path recorded in the entry may be stale and is replaced by the current one.
                info = dataclasses.replace(DatasetInfo.from_json_dict(info_dict), source=source.display)
                return Dataset(info, **arrays)
            except InputError:
                pass  # an entry written by a reader with other checks: rebuild it
    dataset = source.decode(sha256, progress)
    if entry is not None:
        arrays = {
            "train_x": dataset.train_x,
            "train_y": dataset.train_y,
            "test_x": dataset.test_x,
            "test_y": dataset.test_y,
        }
        store_cached(entry, key, arrays, dataset.info.to_json_dict())
    return dataset
