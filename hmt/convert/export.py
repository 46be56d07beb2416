"""torch -> ONNX export with a static shape.

Two exporters: the TorchScript one (``dynamo=False``, default) and the dynamo one. Measured
here on a small CNN: 0.06 s vs 3.5 s, same ops once both fold BatchNorm, and the dynamo
one writes weights to a separate ``.onnx.data`` that must then be folded back. ``auto``
tries the TorchScript exporter first and falls back to dynamo when it fails (ops it no
longer supports), recording which one ran.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hmt.errors import ModelError, UsageError

if TYPE_CHECKING:
    import onnx
    import torch

Exporter = Literal["auto", "torchscript", "dynamo"]
EXPORTERS: tuple[str, ...] = ("auto", "torchscript", "dynamo")
DEFAULT_OPSET = 17


def export_module(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str] | None = None,
    opset: int = DEFAULT_OPSET,
    exporter: Exporter = "auto",
    what: str = "model",
) -> tuple[onnx.ModelProto, str]:
    """Export ``module`` (eval mode) at the example inputs' static shapes.

    Returns the model with every weight inside it, and the exporter that ran
    ("torchscript" or "dynamo"). Raises ModelError naming ``what`` and the cause.
    """
    if exporter not in EXPORTERS:
        raise UsageError(f"unknown exporter {exporter!r}; choose from {', '.join(EXPORTERS)}")
    module.eval()
    order = ["torchscript", "dynamo"] if exporter == "auto" else [exporter]
    errors: list[str] = []
    for name in order:
        try:
            return _export(module, example_inputs, input_names, output_names, opset, dynamo=name == "dynamo"), name
        except ModelError:
            raise
        except Exception as exc:  # noqa: BLE001 - exporters raise anything from deep inside torch
            errors.append(f"{name} exporter: {type(exc).__name__}: {_short(exc)}")
    raise ModelError(f"cannot export {what} to ONNX; " + "; ".join(errors))


def _short(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else repr(exc)
    for line in lines:  # the exporters' most useful line names the unsupported operator
        lowered = line.lower()
        if "unsupported" in lowered or "not supported" in lowered or "no decomposition" in lowered:
            text = line.strip()
            break
    return text[:400]


def _export(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    input_names: Sequence[str],
    output_names: Sequence[str] | None,
    opset: int,
    *,
    dynamo: bool,
) -> onnx.ModelProto:
    import torch

    from hmt.graph.model import load_onnx

    with tempfile.TemporaryDirectory(prefix="hmt-export-") as tmp:
        path = Path(tmp) / "model.onnx"
        kwargs: dict[str, Any] = {
            "input_names": list(input_names),
            "opset_version": opset,
            "dynamo": dynamo,
        }
        if output_names is not None:
            kwargs["output_names"] = list(output_names)
        if not dynamo:
            kwargs["do_constant_folding"] = True
        else:
            kwargs["external_data"] = True
            kwargs["optimize"] = True
        sink = io.StringIO()
        torch_logger = logging.getLogger("torch.onnx")
        level = torch_logger.level
        torch_logger.setLevel(logging.ERROR)  # the exporters log progress and opset notes
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                warnings.simplefilter("ignore")
                torch.onnx.export(module, tuple(example_inputs), str(path), **kwargs)
        finally:
            torch_logger.setLevel(level)
        # Fold a dynamo .onnx.data back into the proto (read only from inside tmp).
        return load_onnx(path)
