"""profile-device: measured device profiles with fitted latency and energy models.

The tree reads as the method (nn-Meter's split of I/O from parsing):

- ``facts``, ``benchmarks``, ``timing``, ``blocktable``, ``load``, ``rpc``, ``power/*``: I/O
  (they run things and return raw numbers);
- ``parsers``, ``features``, ``fits``, ``composition``: pure (raw numbers in, models out);
- ``predictor``: latency/energy of a variant from a profile; ``validate``: predicted vs
  measured; ``schema``: the profile document; ``run``/``stages``: the pipeline.

Importing this package imports neither torch nor onnxruntime.
"""

import hmt.offline_python  # noqa: F401 - refuses Python < 3.10 with a message saying what runs there
from hmt.profile.devices import DEVICES, shipped_profile
from hmt.profile.power.registry import POWER_SOURCES, create_power_source
from hmt.profile.predictor import Predictor
from hmt.profile.run import ProfileOptions, ProfileRun, profile_device
from hmt.profile.schema import ARTIFACT_KIND, DeviceProfile, load_profile, validate_profile

__all__ = [
    "ARTIFACT_KIND",
    "DEVICES",
    "POWER_SOURCES",
    "DeviceProfile",
    "Predictor",
    "ProfileOptions",
    "ProfileRun",
    "create_power_source",
    "load_profile",
    "profile_device",
    "shipped_profile",
    "validate_profile",
]
