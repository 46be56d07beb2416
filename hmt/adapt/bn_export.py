"""Export a variant so the torch-free runtime can re-estimate its BN statistics.

Fused graphs (BN folded into the conv, as convert and fuse write them) have lost what
re-estimation needs. For each graph of the chain (every segment and exit head, or the
whole model) this writes two ONNX graphs with a dynamic batch axis:

- ``<graph>.stats.onnx``: every BN normalises with the batch's own statistics (what torch
  does in train mode) and returns each layer's batch mean and biased variance as extra
  outputs. Chained segment to segment, one run per batch gives every layer's statistics
  exactly as ``recalibrate_bn`` (torch, momentum None) sees them.
- ``<graph>.infer.onnx``: every BN is ``x * scale + shift`` with ``scale``/``shift`` as float32
  initializers whose byte offsets in the file ``bn.json`` records. The device writes the
  re-estimated values at those offsets (numpy alone) and opens the bytes with ONNX
  Runtime, whose optimiser folds the Mul/Add into the conv: the adapted graph runs as fast
  as a fused one. Measured with ORT 1.32, the alternatives cost: an initializer replaced
  through ``SessionOptions.add_initializer`` is ignored once graph optimisation is on, and
  scale/shift fed as graph inputs cannot be folded (1.35-1.6x the fused latency).

``bn.json`` lists, per graph, each BN layer's byte offsets, eps, affine parameters
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
    """Eval-mode BN as ``x * scale + shift``; the buffers are pre-shaped (1, C, 1, ...) so
    that they stay initializers of their own (a reshape would be constant-folded) and hold
    a sentinel until the file's bytes are patched."""

    def __init__(self, index: int, channels: int, dims: int) -> None:
        super().__init__()
        self.index = index
        shape = (1, channels) + (1,) * dims
        g = torch.Generator().manual_seed(0x5EED + index)
        self.register_buffer("scale", torch.randn(shape, generator=g))
        self.register_buffer("shift", torch.randn(shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale: torch.Tensor = self.scale  # type: ignore[assignment]
        shift: torch.Tensor = self.shift  # type: ignore[assignment]
        return x * scale + shift


def _offset(blob: bytes, pattern: bytes, what: str) -> int:
    at = blob.find(pattern)
    if at < 0 or blob.find(pattern, at + 1) >= 0:
        raise ModelError(f"{what}: its initializer bytes are {'absent' if at < 0 else 'not unique'} in the "
                         "exported graph; cannot make it patchable")
    return at


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
def _layer_record(qualified: str, bn: _BatchNorm) -> dict[str, Any]:
    """One BN layer as bn.json lists it: its module, eps, channels and shipped parameters."""
    return {
        "module": qualified,
        "eps": float(bn.eps), "channels": int(bn.num_features),
        "weight": bn.weight.detach().double().tolist() if bn.weight is not None else None,
        "bias": bn.bias.detach().double().tolist() if bn.bias is not None else None,
        "running_mean": bn.running_mean.double().tolist(),  # type: ignore[union-attr]
        "running_var": bn.running_var.double().tolist(),  # type: ignore[union-attr]
    }


def _patch_affine(infer_path: Path, layers: list[dict[str, Any]], norms: list[_BatchNorm],
                  affine_norms: dict[int, _AffineNorm], name: str) -> None:
    """Make the inference graph patchable: where each scale/shift's float32 bytes sit in the file
    (found by their sentinels, recorded in ``layers``), then the shipped values written there (the
    device rewrites them with numpy alone)."""
    blob = bytearray(infer_path.read_bytes())
    for k, (layer, bn) in enumerate(zip(layers, norms, strict=True)):
        norm = affine_norms[k]
        scale, shift = affine_of(bn.weight.detach() if bn.weight is not None else None,
                                 bn.bias.detach() if bn.bias is not None else None,
                                 bn.running_mean, bn.running_var, bn.eps)
        for key, value in (("scale", scale), ("shift", shift)):
            sentinel: torch.Tensor = getattr(norm, key)
            at = _offset(bytes(blob), sentinel.numpy().astype("<f4").tobytes(), f"{name} BN {k} {key}")
            layer[f"{key}_offset"] = at
            blob[at:at + 4 * layer["channels"]] = value.float().numpy().astype("<f4").tobytes()
    infer_path.write_bytes(bytes(blob))


def _record_per_sample(infer_module: nn.Module, x: torch.Tensor, layers: list[dict[str, Any]]) -> torch.Tensor:
    """The spatial size each layer averages over (for the unbiased variance), into ``layers``; returns
    the module's output (shapes only: the sentinels make its values meaningless)."""
    sizes: dict[int, int] = {}
    hooks = [m.register_forward_pre_hook(lambda m, a, s=sizes: s.__setitem__(m.index, a[0][0].numel()))
             for m in infer_module.modules() if isinstance(m, _AffineNorm)]
    y = infer_module(x)
    for hook in hooks:
        hook.remove()
    for k, layer in enumerate(layers):
        layer["per_sample"] = sizes[k] // layer["channels"]
    return y


def export_bn_adaptable(model: nn.Module, example: torch.Tensor, out: Path | str, *,
                        parents: tuple[Any, ...] = (), config: dict[str, Any] | None = None,
                        source_inputs: torch.Tensor | None = None, force: bool = False,
                        what: str = "--out") -> dict[str, Any]:
    """Write the stats and inference graphs of ``model`` (eval mode, unchanged) to ``out``.

    ``example`` is one input batch (its batch size does not matter: the axis is dynamic).
    ``source_inputs`` (model inputs of the training distribution, e.g. the supernet's
    calibration set) give the drift reference serve compares live inputs with.
    Returns the spec written to ``bn.json``.
    """
    import copy

    model = model.eval()
    spec: dict[str, Any] = {"input_shape": list(example.shape[1:]), "graphs": []}
    if source_inputs is not None:
        from hmt.adapt.drift import DriftReference

        spec["drift_reference"] = DriftReference.from_inputs(source_inputs.numpy()).to_json_dict()
    with ArtifactWriter(out, kind=BN_ADAPTABLE_KIND, config=config or {}, parents=parents, force=force,
                        what=what) as writer:
        h = example
        segment_out: dict[int, torch.Tensor] = {}
        for name, module, reads in graphs_of(model):
            x = segment_out[reads] if reads is not None else h
            stats_module = copy.deepcopy(module).eval()
            sink: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            norms = _replace_norms(stats_module, lambda bn, k, s=sink: _BatchStatsNorm(bn, s, k))
            infer_module = copy.deepcopy(module).eval()
            dims = x.dim() - 2
            affine_norms: dict[int, _AffineNorm] = {}

            def make_affine(bn: _BatchNorm, k: int, d: int = dims,
                            keep: dict[int, _AffineNorm] = affine_norms) -> nn.Module:
                keep[k] = _AffineNorm(k, bn.num_features, d)
                return keep[k]

            _replace_norms(infer_module, make_affine)
            layers: list[dict[str, Any]] = []
            stat_names = []
            for k, (qualified, bn) in enumerate(norms):
                stat_names += [f"bn{k}_mean", f"bn{k}_var"]
                layers.append(_layer_record(qualified, bn))
            stats_path = writer.path(f"{name}.stats.onnx")
            infer_path = writer.path(f"{name}.infer.onnx")
            _export(_WithStats(stats_module, sink, len(norms)), (x,), stats_path, ["input"], ["output", *stat_names])
            _export(infer_module, (x,), infer_path, ["input"], ["output"])
            _patch_affine(infer_path, layers, [bn for _, bn in norms], affine_norms, name)
            y = _record_per_sample(infer_module, x, layers)
            spec["graphs"].append({"name": name, "reads_segment": reads, "stats": stats_path.name,
                                   "infer": infer_path.name, "layers": layers})
            if reads is None:
                segment_out[len(segment_out)] = y
                h = y
        writer.write_json(BN_SPEC_NAME, spec)
        writer.metrics["bn_layers"] = sum(len(g["layers"]) for g in spec["graphs"])
    return spec
