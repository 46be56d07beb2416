"""An elastified supernet rebuilt from its artifact's record (no training code).

``hmt.supernet.artifact.load_supernet`` calls :func:`rebuild` for an artifact whose model
info carries an ``elastify`` record; training (``hmt.supernet.elastify.train``) writes that
record and depends on the artifact module, never the other way.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from hmt.errors import ModelError
from hmt.supernet.elastify.source import ModelSpec, build_model
from hmt.supernet.elastify.supernet import ElastifiedSupernet


def original_model(model_info: dict[str, Any], source_file: Path | None, weights: Path | None = None) -> nn.Module:
    """The user's network an artifact was elastified from, rebuilt from its record, in eval mode;
    with ``weights`` loaded (strict), else as its factory builds it."""
    spec = ModelSpec.from_json_dict(model_info["elastify"]["model"])
    try:
        return build_model(replace(spec, weights=None if weights is None else str(weights)),
                           file_override=source_file)
    except ModelError as exc:  # a factory that reads a file beside it, in an artifact made before that was refused
        raise ModelError(f"{exc}; the artifact rebuilds the network from its copy of the model file alone, with "
                         "nothing beside it") from exc


def rebuild(model_info: dict[str, Any], source_file: Path | None) -> ElastifiedSupernet:
    """The supernet of an artifact, without weights (``load_supernet`` loads them next)."""
    spec = ModelSpec.from_json_dict(model_info["elastify"]["model"])
    model = original_model(model_info, source_file)
    operators = model_info.get("operators")
    # The seed and init only shape fresh weights, which the artifact's weights replace.
    return ElastifiedSupernet(model, name=spec.torchvision or str(spec.factory),
                              input_shape=tuple(spec.input_shape[1:]), leaves=spec.leaves,
                              operators=tuple(operators) if operators is not None else None, seed=0, init=False)
