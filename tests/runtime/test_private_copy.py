"""Native libraries are loaded from a private copy in the temporary folder (hmt.runtime.verified): a copy
that cannot be written there (a full or read-only disk) names that folder, not the bundle's file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hmt.artifacts import ArtifactWriter, load_artifact
from hmt.errors import ArtifactError, DeviceError
from hmt.runtime import verified


@pytest.fixture
def artifact(tmp_path: Path) -> object:
    with ArtifactWriter(tmp_path / "bundle", kind="bundle", config={}) as writer:
        writer.write_bytes("lib/segment_0.so", b"\x7fELF" + b"x" * 200_000)
    return load_artifact(tmp_path / "bundle", kind="bundle")


def test_a_full_temporary_folder_is_named_not_the_bundles_file(artifact: object, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")

    def full_copy(prefix: str = "", suffix: str = "", dir: str | None = None) -> tuple[int, str]:
        return os.open("/dev/full", os.O_WRONLY), str(tmp_path / "private" / "lib-x.so")

    monkeypatch.setattr(verified.tempfile, "mkstemp", full_copy)
    with pytest.raises(DeviceError) as caught, verified.private_copy(artifact, "lib/segment_0.so"):  # type: ignore[arg-type]
        pass
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "private") + ": cannot write the private copy of ")
    assert "No space left on device" in message and "TMPDIR" in message and "cannot be read" not in message


def test_an_unreadable_bundle_file_still_names_the_file(artifact: object, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def failing_open(path: object, *args: object, **kwargs: object) -> object:
        if str(path).endswith("segment_0.so"):
            raise OSError(5, "Input/output error", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(ArtifactError, match=r"segment_0\.so: cannot be read \(Input/output error\)"), \
            verified.private_copy(artifact, "lib/segment_0.so"):  # type: ignore[arg-type]
        pass


def test_a_temporary_folder_that_cannot_hold_the_copy_at_all(artifact: object, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(prefix: str = "", suffix: str = "", dir: str | None = None) -> tuple[int, str]:
        raise OSError(30, "Read-only file system", str(tmp_path / "ro" / "lib-x.so"))

    monkeypatch.setattr(verified.tempfile, "mkstemp", refused)
    with pytest.raises(DeviceError, match="Read-only file system"), \
            verified.private_copy(artifact, "lib/segment_0.so"):  # type: ignore[arg-type]
        pass
