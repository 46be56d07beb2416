"""Device names ``profile-device`` accepts, and the estimated profiles shipped in ``profiles/``.

Names match the deploy target registry. ``host`` is measured here; the others are
measured through ``--rpc`` when reachable, and otherwise come from the shipped estimated
profile (datasheet and published figures, cited inside the file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hmt.errors import InputError, UsageError
from hmt.profile.schema import DeviceProfile, read_profile_json


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    description: str
    shipped: str | None  # file name in profiles/, or None


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        DeviceSpec("host", "this machine, measured here", None),
        DeviceSpec("jetson-nano", "NVIDIA Jetson Nano 4GB: 4x Cortex-A57, 128-core Maxwell GPU", "jetson-nano.json"),
        DeviceSpec("jetson-xavier-nx", "NVIDIA Jetson Xavier NX: 6x Carmel, 384-core Volta GPU",
                   "jetson-xavier-nx.json"),
        DeviceSpec("raspberry-pi-4b", "Raspberry Pi 4 Model B: 4x Cortex-A72 at 1.5 GHz", "raspberry-pi-4b.json"),
        DeviceSpec("generic-aarch64", "any 64-bit Arm Linux board (measure it through --rpc)", None),
    )
}


def device_spec(name: str) -> DeviceSpec:
    if name not in DEVICES:
        raise UsageError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[name]


def profiles_dir() -> Path:
    """``$HMT_PROFILES_DIR``, else ``profiles/`` at the root of the hmt source tree."""
    env = os.environ.get("HMT_PROFILES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "profiles"


def shipped_profile(name: str) -> DeviceProfile:
    spec = device_spec(name)
    if spec.shipped is None:
        raise UsageError(f"no estimated profile is shipped for {name!r}; measure it (here, or through --rpc)")
    path = profiles_dir() / spec.shipped
    if not path.is_file():
        raise InputError(f"{path}: the shipped profile for {name!r} is missing (set HMT_PROFILES_DIR?)")
    return read_profile_json(path)
