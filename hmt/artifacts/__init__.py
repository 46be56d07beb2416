"""Artifacts: one directory per stage output, described by a checksummed ``manifest.json``."""

from hmt.artifacts.manifest import SCHEMA_VERSION, FileRecord, Manifest, ParentRecord
from hmt.artifacts.paths import safe_join
from hmt.artifacts.store import Artifact, ArtifactWriter, atomic_write_bytes, load_artifact

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "ArtifactWriter",
    "FileRecord",
    "Manifest",
    "ParentRecord",
    "atomic_write_bytes",
    "load_artifact",
    "safe_join",
]
