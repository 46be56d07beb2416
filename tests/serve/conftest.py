"""Shared fixtures: one tiny bundle per session (building it costs ~0.1 s of onnx.helper)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from serve_bundles import FAST_SWITCH, make_bundle


@pytest.fixture(scope="session")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("serve") / "bundle", serve=FAST_SWITCH)
