"""Export a variant so the torch-free runtime can re-estimate its BN statistics.

Fused graphs (BN folded into the conv, as convert and fuse write them) have lost what
re-estimation needs. For each graph of the chain (every segment and exit head, or the
whole model) this writes two ONNX graphs with a dynamic batch axis:

- ``<graph>.stats.onnx``: every BN normalises with the batch's own statistics (what torch
  does in train mode) and returns each layer's batch mean and biased variance as extra
  outputs. Chained segment to segment, one run per batch gives every layer's statistics
  exactly as ``recalibrate_bn`` (torch, momentum None) sees them.
- ``<graph>.infer.onnx``: every BN is ``x * scale + shift`` with ``scale``/``shift`` as graph
  inputs, fed on every run. Measured with ONNX Runtime 1.32: an initializer replaced
  through ``SessionOptions.add_initializer`` is ignored once any graph optimisation is on
  (the conv-mul fusion has already consumed it), so inputs are the way to change the
  statistics without onnx on the device; the price is one Mul and Add per BN that ORT
  cannot fold into the conv (benchmarks/README.md measures it).

``bn.json`` lists, per graph, each BN layer's initializer names, eps, affine parameters
and the statistics it shipped with. The output is an artifact of kind ``bn-adaptable``
(every file checksummed); ``hmt.adapt.bn_runtime`` loads it without torch or onnx.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hmt.artifacts import ArtifactWriter
from hmt.errors import ModelError

BN_ADAPTABLE_KIND = "bn-adaptable"
BN_SPEC_NAME = "bn.json"
OPSET = 17


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.dim() - 2)


class _BatchStatsNorm(nn.Module):
    """Train-mode BN arithmetic that also hands its batch statistics to ``sink``."""

    def __init__(self, bn: _BatchNorm, sink: dict[int, tuple[torch.Tensor, torch.Tensor]], index: int) -> None:
        super().__init__()
        self.index = index
        self.eps = bn.eps
        self.weight = nn.Parameter(bn.weight.detach().clone()) if bn.weight is not None else None
        self.bias = nn.Parameter(bn.bias.detach().clone()) if bn.bias is not None else None
        self._sink = sink

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = [0, *range(2, x.dim())]
        mean = x.mean(dim=dims)
        var = ((x - mean.view(_shape(x))) ** 2).mean(dim=dims)
        self._sink[self.index] = (mean, var)
        y = (x - mean.view(_shape(x))) / torch.sqrt(var.view(_shape(x)) + self.eps)
        if self.weight is not None:
            y = y * self.weight.view(_shape(x))
        if self.bias is not None:
            y = y + self.bias.view(_shape(x))
        return y


class _AffineNorm(nn.Module):
    """Eval-mode BN as ``x * scale + shift``, scale and shift read from graph inputs."""

    def __init__(self, slots: dict[int, tuple[torch.Tensor, torch.Tensor]], index: int) -> None:
        super().__init__()
        self.index = index
        self._slots = slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self._slots[self.index]
        return x * scale + shift


class _WithAffineInputs(nn.Module):
    """The inference graph: inputs are the data, then every BN's scale and shift."""

    def __init__(self, inner: nn.Module, slots: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self.inner = inner
        self._slots = slots

    def forward(self, x: torch.Tensor, *affine: torch.Tensor) -> torch.Tensor:
        self._slots.clear()
        for k in range(len(affine) // 2):
            self._slots[k] = (affine[2 * k], affine[2 * k + 1])
        return self.inner(x)


def affine_of(weight: Any, bias: Any, mean: Any, var: Any, eps: float) -> tuple[Any, Any]:
    """Eval-mode BN as y = x * scale + shift (works on numpy arrays and tensors)."""
    inv = 1.0 / (var + eps) ** 0.5
    scale = inv * weight if weight is not None else inv
    shift = -mean * scale + (bias if bias is not None else 0.0)
    return scale, shift


def _replace_norms(module: nn.Module, make: Any) -> list[tuple[str, _BatchNorm]]:
    """Replace every BN below ``module`` by ``make(bn, index)`` in place (index: order of
    registration); returns (qualified name, original BN) in that order."""
    found: list[tuple[str, _BatchNorm]] = []
    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, _BatchNorm):
                setattr(child, attr, make(sub, len(found)))
                found.append((f"{name}.{attr}" if name else attr, sub))
    return found


class _WithStats(nn.Module):
    """The graph's output, then every BN's (mean, var) in registration order."""

    def __init__(self, inner: nn.Module, sink: dict[int, tuple[torch.Tensor, torch.Tensor]], count: int) -> None:
        super().__init__()
        self.inner = inner
        self._sink = sink
        self._count = count

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self._sink.clear()
        y = self.inner(x)
        missing = [k for k in range(self._count) if k not in self._sink]
        if missing:
            raise ModelError(f"batch-norm layers {missing[:3]} are not executed by the forward pass")
        return (y, *[t for k in range(self._count) for t in self._sink[k]])


def _export(module: nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, input_names: list[str],
            output_names: list[str]) -> None:
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        level = logging.getLogger("torch.onnx").level
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        try:
            torch.onnx.export(
                module, inputs, str(path), input_names=input_names, output_names=output_names, opset_version=OPSET,
                dynamo=False, do_constant_folding=True,
                dynamic_axes={name: {0: "batch"} for name in [input_names[0], output_names[0]]},
            )
        except Exception as exc:  # the exporter raises anything from deep inside torch
            raise ModelError(f"cannot export {path.name} for BN re-estimation: {type(exc).__name__}: {exc}") from exc
        finally:
            logging.getLogger("torch.onnx").setLevel(level)


def graphs_of(model: nn.Module) -> list[tuple[str, nn.Module, int | None]]:
    """(graph name, module, segment it reads or None for a segment) in run order."""
    segments = getattr(model, "segments", None)
    heads = getattr(model, "exit_heads", None)
    if segments is None or heads is None:
        return [("model", model, None)]
    out: list[tuple[str, nn.Module, int | None]] = []
    for k, (segment, head) in enumerate(zip(segments, heads, strict=True)):
        out.append((f"segment_{k}", segment, None))
        out.append((f"exit_{k}", head, k))
    return out


@torch.no_grad()
def export_bn_adaptable(model: nn.Module, example: torch.Tensor, out: Path | str, *,
                        parents: tuple[Any, ...] = (), config: dict[str, Any] | None = None,
                        source_inputs: torch.Tensor | None = None) -> dict[str, Any]:
    """Write the stats and inference graphs of ``model`` (eval mode, unchanged) to ``out``.

    ``example`` is one input batch (its batch size does not matter: the axis is dynamic).
    ``source_inputs`` (model inputs of the training distribution, e.g. the supernet's
    calibration set) give the drift reference serve compares live inputs with.
    Returns the spec written to ``bn.json``.
    """
    import copy

    import onnx

    model = model.eval()
    spec: dict[str, Any] = {"input_shape": list(example.shape[1:]), "graphs": []}
    if source_inputs is not None:
        from hmt.adapt.drift import DriftReference

        spec["drift_reference"] = DriftReference.from_inputs(source_inputs.numpy()).to_json_dict()
    with ArtifactWriter(out, kind=BN_ADAPTABLE_KIND, config=config or {}, parents=parents) as writer:
        h = example
        segment_out: dict[int, torch.Tensor] = {}
        for name, module, reads in graphs_of(model):
            x = segment_out[reads] if reads is not None else h
            stats_module = copy.deepcopy(module).eval()
            sink: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            norms = _replace_norms(stats_module, lambda bn, k, s=sink: _BatchStatsNorm(bn, s, k))
            infer_module = copy.deepcopy(module).eval()
            slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            _replace_norms(infer_module, lambda bn, k, s=slots: _AffineNorm(s, k))
            affine_shape = (1, -1) + (1,) * (x.dim() - 2)
            affine: list[torch.Tensor] = []
            for _, bn in norms:
                scale, shift = affine_of(bn.weight.detach() if bn.weight is not None else None,
                                         bn.bias.detach() if bn.bias is not None else None,
                                         bn.running_mean, bn.running_var, bn.eps)
                affine += [scale.float().reshape(affine_shape), shift.float().reshape(affine_shape)]
            layers: list[dict[str, Any]] = []
            stat_names = []
            for k, (qualified, bn) in enumerate(norms):
                stat_names += [f"bn{k}_mean", f"bn{k}_var"]
                layers.append({
                    "module": qualified, "scale": f"bn{k}_scale", "shift": f"bn{k}_shift",
                    "eps": float(bn.eps), "channels": int(bn.num_features),
                    "weight": bn.weight.detach().double().tolist() if bn.weight is not None else None,
                    "bias": bn.bias.detach().double().tolist() if bn.bias is not None else None,
                    "running_mean": bn.running_mean.double().tolist(),  # type: ignore[union-attr]
                    "running_var": bn.running_var.double().tolist(),  # type: ignore[union-attr]
                })
            stats_path = writer.path(f"{name}.stats.onnx")
            infer_path = writer.path(f"{name}.infer.onnx")
            _export(_WithStats(stats_module, sink, len(norms)), (x,), stats_path, ["input"], ["output", *stat_names])
            affine_names = [n for layer in layers for n in (layer["scale"], layer["shift"])]
            wrapped = _WithAffineInputs(infer_module, slots)
            _export(wrapped, (x, *affine), infer_path, ["input", *affine_names], ["output"])
            names = [i.name for i in onnx.load(str(infer_path)).graph.input]
            if names != ["input", *affine_names]:
                raise ModelError(f"{infer_path.name}: graph inputs {names[:4]}...; expected input, then each BN's "
                                 "scale and shift")
            # The spatial size each layer averages over, for the unbiased variance.
            sizes: dict[int, int] = {}
            hooks = [m.register_forward_pre_hook(lambda m, a, s=sizes: s.__setitem__(m.index, a[0][0].numel()))
                     for m in infer_module.modules() if isinstance(m, _AffineNorm)]
            y = wrapped(x, *affine)
            for hook in hooks:
                hook.remove()
            for k, layer in enumerate(layers):
                layer["per_sample"] = sizes[k] // layer["channels"]
            spec["graphs"].append({"name": name, "reads_segment": reads, "stats": stats_path.name,
                                   "infer": infer_path.name, "layers": layers})
            if reads is None:
                segment_out[len(segment_out)] = y
                h = y
        writer.write_json(BN_SPEC_NAME, spec)
        writer.metrics["bn_layers"] = sum(len(g["layers"]) for g in spec["graphs"])
    return spec
