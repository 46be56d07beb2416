"""Option aliases shared by every command, so flags mean the same thing everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else there.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only errors.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors (or set HMT_DEBUG=1).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of every random generator the command uses.")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Replace an existing hmt artifact of another kind at the output path (never a folder that "
                    "is not an hmt artifact, nor an input).")]
OutDirOpt = Annotated[Path, typer.Option("--out", "-o", help="Output artifact directory (replaced atomically).")]
# Resumable training (train-supernet, specialize): the same checkpoint and cache flags.
CheckpointDirOpt = Annotated[Path | None, typer.Option(
    "--checkpoint-dir", help="Where resumable checkpoints go (default OUT.ckpt).")]
RestartOpt = Annotated[bool, typer.Option("--restart", help="Discard an existing checkpoint and start over.")]
KeepCheckpointOpt = Annotated[bool, typer.Option("--keep-checkpoint", help="Keep the checkpoint after success.")]
CacheDirOpt = Annotated[Path | None, typer.Option(
    "--cache-dir", help="Decoded-dataset cache (default ~/.cache/hmt/data).")]
