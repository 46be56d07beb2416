"""Intel RAPL (and AMD's RAPL-compatible counters) through Linux powercap.

Reads the cumulative ``energy_uj`` of a domain (``package-0`` by default), handling the
wrap at ``max_energy_range_uj``. Since Linux 5.10 the counter is readable by root only.
"""

from __future__ import annotations

from pathlib import Path

from hmt.errors import DeviceError
from hmt.profile.power.base import PollingSource

POWERCAP = Path("/sys/class/powercap")


def find_rapl_domain(domain: str, root: Path = POWERCAP) -> Path:
    if not root.is_dir():
        raise DeviceError(
            f"Intel RAPL: {root} does not exist (no powercap support in this kernel, or a virtual machine "
            "that hides it); choose another power source"
        )
    found = []
    for zone in sorted(root.glob("intel-rapl:*")):
        name_file = zone / "name"
        if name_file.is_file():
            name = name_file.read_text().strip()
            found.append(name)
            if name == domain:
                return zone
    if not found:
        raise DeviceError(f"Intel RAPL: no intel-rapl:* zones under {root} (the intel_rapl driver is not loaded)")
    raise DeviceError(f"Intel RAPL: no domain {domain!r}; this machine has {found}")


class RaplSource(PollingSource):
    name = "rapl"
    cumulative = True

    def __init__(self, *, domain: str = "package-0", interval_s: float = 0.02, root: str | Path = POWERCAP) -> None:
        super().__init__(interval_s=interval_s)
        zone = find_rapl_domain(domain, Path(root))
        self.energy_file = zone / "energy_uj"
        try:
            self.range_uj = int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            self.range_uj = 2**32
        self._last_raw: int | None = None
        self._wraps = 0

    def read(self) -> float:
        try:
            raw = int(self.energy_file.read_text())
        except PermissionError as exc:
            raise DeviceError(
                f"Intel RAPL: {self.energy_file} is readable by root only (since Linux 5.10); "
                "run as root or grant read access"
            ) from exc
        except (OSError, ValueError) as exc:
            raise DeviceError(f"Intel RAPL: cannot read {self.energy_file} ({exc})") from exc
        if self._last_raw is not None and raw < self._last_raw:
            self._wraps += 1
        self._last_raw = raw
        return (raw + self._wraps * self.range_uj) / 1e6
