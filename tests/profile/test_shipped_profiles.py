"""Every profile shipped in profiles/ loads, says where its numbers come from, and predicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from hmt.profile import load_profile

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
SHIPPED = sorted(p for p in PROFILES_DIR.glob("*.json") if p.name != "schema.json")


def test_profiles_are_shipped() -> None:
    names = {p.name for p in SHIPPED}
    assert {"jetson-nano.json", "jetson-xavier-nx.json", "raspberry-pi-4b.json", "host-amd-epyc-2c.json",
            "nvidia-h100-cuda-torch.json"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_profile_loads_with_provenance(path: Path) -> None:
    profile = load_profile(path)
    assert profile.device_id
    assert profile.doc["device"]["origin"] in ("measured", "estimated")
    assert profile.doc["provenance"], f"{path.name}: no provenance"
