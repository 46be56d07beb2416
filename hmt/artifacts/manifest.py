"""The manifest record written beside every artifact, and the environment it records."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from hmt.errors import ArtifactError

SCHEMA_VERSION = 2
# Version 1 manifests (written before they carried their own digest) still load, unverified
# beyond the files they list; from version 2 on the digest is required.
READABLE_SCHEMA_VERSIONS = (1, 2)
MANIFEST_NAME = "manifest.json"
DIGEST_FIELD = "content_sha256"

_MEDIA_TYPES = {
    ".json": "application/json",
    ".csv": "text/csv",
    ".parquet": "application/vnd.apache.parquet",
    ".png": "image/png",
    ".safetensors": "application/vnd.safetensors",
    ".onnx": "application/onnx",
    ".data": "application/octet-stream",
    ".so": "application/x-sharedlib",
    ".tar": "application/x-tar",
    ".gz": "application/gzip",
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".npy": "application/x-npy",
    ".npz": "application/x-npz",
    ".pt": "application/x-torch-checkpoint",
}

# Versions recorded with every artifact, read from package metadata so that recording
# them never imports torch or tvm.
_TRACKED_PACKAGES = ("torch", "numpy", "onnx", "onnxruntime", "apache-tvm", "onnxsim", "onnxslim", "pandas")


def content_digest(data: Mapping[str, Any]) -> str:
    """sha256 of a manifest's canonical JSON (sorted keys, no spaces), its own digest field left out.

    Computed on the JSON-parsed form, so the writer (which round-trips its dict first) and every
    reader hash the same text whatever the key types or float formatting of the writer's dict.
    """
    body = {key: value for key, value in data.items() if key != DIGEST_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_content_digest(data: Mapping[str, Any], *, source: str) -> None:
    """Refuse a manifest whose recorded digest is missing or does not match its content (a hand edit
    of its config, metrics or file list that the files' own checksums cannot see)."""
    recorded = data.get(DIGEST_FIELD)
    if not isinstance(recorded, str):
        raise ArtifactError(f"{source}: no {DIGEST_FIELD}; a schema_version {data.get('schema_version')} manifest "
                            "records the sha256 of its own content")
    if recorded != content_digest(data):
        raise ArtifactError(f"{source}: its content does not match its {DIGEST_FIELD}; the manifest was edited "
                            "after it was written (rerun the stage that wrote it rather than editing it)")


def media_type_for(name: str) -> str:
    for suffix, media in _MEDIA_TYPES.items():
        if name.endswith(suffix):
            return media
    return "application/octet-stream"


def environment_record() -> dict[str, Any]:
    packages: dict[str, str | None] = {}
    for name in _TRACKED_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": packages,
    }


@dataclass(frozen=True)
class FileRecord:
    path: str
    sha256: str
    size_bytes: int
    media_type: str


@dataclass(frozen=True)
class ParentRecord:
    kind: str
    path: str
    manifest_sha256: str


@dataclass(frozen=True)
class Manifest:
    kind: str
    tool_version: str
    created_utc: str
    config: dict[str, Any]
    parents: tuple[ParentRecord, ...]
    files: tuple[FileRecord, ...]
    environment: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["parents"] = [asdict(p) for p in self.parents]
        data["files"] = [asdict(f) for f in self.files]
        plain: dict[str, Any] = json.loads(json.dumps(data, allow_nan=False))  # as a reader will parse it
        plain[DIGEST_FIELD] = content_digest(plain)
        return plain

    @classmethod
    def from_json_dict(cls, data: Any, *, source: str) -> Manifest:
        if not isinstance(data, dict):
            raise ArtifactError(f"{source}: expected a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version not in READABLE_SCHEMA_VERSIONS or isinstance(version, bool):
            readable = " and ".join(str(v) for v in READABLE_SCHEMA_VERSIONS)
            raise ArtifactError(f"{source}: unknown schema_version {version!r}; this hmt reads versions {readable}")
        if version >= 2:
            check_content_digest(data, source=source)
        try:
            return cls(
                kind=str(data["kind"]),
                tool_version=str(data["tool_version"]),
                created_utc=str(data["created_utc"]),
                config=dict(data["config"]),
                parents=tuple(ParentRecord(**p) for p in data["parents"]),
                files=tuple(FileRecord(**f) for f in data["files"]),
                environment=dict(data["environment"]),
                metrics=dict(data.get("metrics", {})),
                schema_version=int(version),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{source}: malformed manifest ({exc})") from exc
