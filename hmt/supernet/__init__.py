"""The elastic supernet: backbones, compression operators, exits, search space, training."""

import hmt.offline_python  # noqa: F401 - refuses Python < 3.10 with a message saying what runs there
from hmt.supernet.space import ArchConfig, BlockPosition, SearchSpace

__all__ = ["ArchConfig", "BlockPosition", "SearchSpace", "build_supernet", "load_supernet"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # torch-land names load lazily so ``hmt.supernet.space`` stays importable without torch.
    if name == "build_supernet":
        from hmt.supernet.supernet import build_supernet

        return build_supernet
    if name in ("load_supernet", "LoadedSupernet"):
        from hmt.supernet import artifact

        return getattr(artifact, name)
    raise AttributeError(name)
