"""Fixtures for the data-layer tests: the shared datasets and session-wide loaded copies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hmt.data import Dataset, load_dataset

REPO_ROOT = Path(__file__).resolve().parents[2]


def _shared_root() -> Path | None:
    env = os.environ.get("HMT_SHARED")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared")
    for candidate in candidates:
        if (candidate / "datasets").is_dir():
            return candidate
    return None


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """``<shared>/datasets``, from $HMT_SHARED or ../shared beside the repo; skip if absent."""
    root = _shared_root()
    if root is None:
        pytest.skip("shared datasets not found: set HMT_SHARED or place shared/ beside the repo root")
    return root / "datasets"


def _dataset_dir(shared_datasets: Path, name: str) -> Path:
    folder = shared_datasets / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent from the shared datasets")
    return folder


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hmt-data-cache")


@pytest.fixture(scope="session")
def embedded_cifar(session_cache: Path) -> Dataset:
    return load_dataset("cifar10", cache_dir=session_cache)


@pytest.fixture(scope="session")
def mnist(shared_datasets: Path, session_cache: Path) -> Dataset:
    return load_dataset("mnist", _dataset_dir(shared_datasets, "mnist5k"), cache_dir=session_cache)


@pytest.fixture(scope="session")
def basicmotions(shared_datasets: Path, session_cache: Path) -> Dataset:
    return load_dataset("basicmotions", _dataset_dir(shared_datasets, "basicmotions"), cache_dir=session_cache)


@pytest.fixture(scope="session")
def fsdd_dir(shared_datasets: Path) -> Path:
    return _dataset_dir(shared_datasets, "fsdd")


@pytest.fixture(scope="session")
def fsdd(fsdd_dir: Path, session_cache: Path) -> Dataset:
    return load_dataset("fsdd", fsdd_dir, cache_dir=session_cache)


@pytest.fixture(autouse=True)
def _no_home_cache(monkeypatch: pytest.MonkeyPatch, session_cache: Path) -> None:
    # A test that forgets cache_dir must never write into the user's ~/.cache.
    monkeypatch.setenv("HMT_CACHE_DIR", str(session_cache / "env-root"))


@pytest.fixture(scope="session")
def basicmotions_dir(shared_datasets: Path) -> Path:
    return _dataset_dir(shared_datasets, "basicmotions")
