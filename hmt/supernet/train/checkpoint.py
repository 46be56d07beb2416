"""Resumable training state: written atomically after every epoch, read weights-only.

A checkpoint holds tensors and plain Python values only, so ``torch.load(weights_only=True)``
reads it and a tampered file cannot run code. The resolved config's fingerprint is stored
with it; resuming with another config is refused rather than silently mixed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from hmt.artifacts import atomic_write_bytes
from hmt.artifacts.outputs import check_owned_folder, remove_owned_files
from hmt.errors import ArtifactError, UsageError

CHECKPOINT_NAME = "checkpoint.pt"


def claim_checkpoint_dir(directory: Path, *, inputs: tuple[Path | str, ...] = ()) -> Path:
    """Refuse a checkpoint folder holding anything but hmt's checkpoint (it is emptied after success)."""
    return check_owned_folder(directory, names=(CHECKPOINT_NAME,), what="--checkpoint-dir", inputs=inputs)


def release_checkpoint_dir(directory: Path) -> None:
    """Remove the checkpoint, and the folder if nothing else is in it."""
    remove_owned_files(directory, names=(CHECKPOINT_NAME,))


def resume_message(directory: Path, epochs_done: int, where: str) -> str:
    """The line a resumed run reports: which epoch it goes on from, and from which checkpoint."""
    return f"resuming from epoch {epochs_done + 1} ({where}), checkpoint {directory / CHECKPOINT_NAME}"


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(directory / CHECKPOINT_NAME, buffer.getvalue())


def load_checkpoint(directory: Path, *, config_fingerprint: str) -> dict[str, Any] | None:
    path = directory / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ArtifactError(f"{path}: unreadable checkpoint ({exc}); delete it or pass --restart") from exc
    if not isinstance(state, dict) or "config_fingerprint" not in state:
        raise ArtifactError(f"{path}: not an hmt training checkpoint; delete it or pass --restart")
    if state["config_fingerprint"] != config_fingerprint:
        raise UsageError(
            f"{path}: was made with another training config ({state['config_fingerprint']} vs {config_fingerprint});"
            " rerun with the same options to resume, or pass --restart to start over"
        )
    return state
