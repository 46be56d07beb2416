"""Shared fixtures: the tiny conv bundle and its device/peer offload bundles (built once per session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from offload_bundles import make_conv_bundle

from hmt.deploy.offload import OffloadBundles, write_offload_bundles


@pytest.fixture(scope="session")
def conv_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_conv_bundle(tmp_path_factory.mktemp("offload") / "bundle")


@pytest.fixture(scope="session")
def offload_bundles(conv_bundle: Path) -> OffloadBundles:
    root = conv_bundle.parent
    return write_offload_bundles(conv_bundle, root / "device", root / "peer", seed=3)
