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
    """Refuse a checkpoint folder holding anything but hmt's checkpoint (it is emptied after success);
    a ``checkpoint.pt`` of the user's (a common name) is not hmt's."""
    return check_owned_folder(directory, names=(CHECKPOINT_NAME,), what="--checkpoint-dir", inputs=inputs,
                              recognise=is_training_checkpoint)


def is_training_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint hmt's training wrote (a state with its config's fingerprint)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - whatever torch cannot load as hmt's is not hmt's
        return False
    return isinstance(state, dict) and "config_fingerprint" in state


def release_checkpoint_dir(directory: Path) -> None:
    """Remove the checkpoint, and the folder if nothing else is in it."""
    remove_owned_files(directory, names=(CHECKPOINT_NAME,))


def resume_message(directory: Path, history: list[dict[str, Any]], where: str) -> str:
    """The line a resumed run reports: which epoch it goes on from (after the epochs in the saved
    ``history``), and from which checkpoint."""
    done = sum(1 for entry in history if "epoch_s" in entry)
    return f"resuming from epoch {done + 1} ({where}), checkpoint {directory / CHECKPOINT_NAME}"


def open_checkpoint(directory: Path, *, config_fingerprint: str, restart: bool) -> dict[str, Any] | None:
    """Create ``directory``, drop its checkpoint with ``restart``, and return the saved state (None: start)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_NAME
    if restart and path.exists():
        if not is_training_checkpoint(path):  # --restart drops hmt's checkpoint, never a file of the user's
            raise ArtifactError(f"{path}: not an hmt training checkpoint; hmt does not delete files it did not "
                                "write: move it, or give another --checkpoint-dir")
        path.unlink()
    return load_checkpoint(directory, config_fingerprint=config_fingerprint)


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
        raise ArtifactError(f"{path}: unreadable, not an hmt training checkpoint ({exc}); move it, or give another "
                            "--checkpoint-dir") from exc
    if not isinstance(state, dict) or "config_fingerprint" not in state:
        raise ArtifactError(f"{path}: not an hmt training checkpoint; move it, or give another --checkpoint-dir")
    if state["config_fingerprint"] != config_fingerprint:
        raise UsageError(
            f"{path}: was made with another training config ({state['config_fingerprint']} vs {config_fingerprint});"
            " rerun with the same options to resume, or pass --restart to start over"
        )
    return state
