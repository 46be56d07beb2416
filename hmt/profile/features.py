"""Per-layer cost features of a module: MACs C_l, bytes moved M_l (AdaScale eq. 4), intensity.

A forward pass at the real input shape with hooks on the leaf modules records, per
layer, C_l (multiply-accumulates), M_l = (in + out + weights + bias) * bytes (AdaScale
eq. 4) and the arithmetic intensity delta_l = C_l / M_l (CrowdHMTware eq. 2).

Counted: convolutions, linear layers, pooling, parameter-free element-wise leaves
(activations; C = output elements) and the per-element layers with parameters (PReLU,
GroupNorm, LayerNorm, InstanceNorm: C = output elements, plus their weights' bytes). BatchNorm
is left out: every engine hmt uses folds it into the preceding convolution at export. Dropout
and Identity cost nothing in eval. A leaf with parameters of a type not listed here is refused
by name, never counted as free. Element-wise work written inline in ``forward`` (a residual
``+``) is invisible to hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hmt.errors import ModelError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LayerFeature:
    name: str
    kind: str
    macs: int
    input_bytes: int
    output_bytes: int
    weight_bytes: int
    bias_bytes: int

    @property
    def bytes_moved(self) -> int:
        """AdaScale eq. 4: (in + out + w + b) * bytes."""
        return self.input_bytes + self.output_bytes + self.weight_bytes + self.bias_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity delta = C / M in MACs per byte."""
        return self.macs / self.bytes_moved if self.bytes_moved else 0.0


def conv_feature(
    name: str, *, c_in: int, c_out: int, kernel: Sequence[int], out_spatial: Sequence[int],
    in_spatial: Sequence[int], groups: int = 1, bias: bool = True, batch: int = 1, dtype_bytes: int = 4,
) -> LayerFeature:
    """Analytic features of a convolution (any dimensionality)."""
    k = 1
    for v in kernel:
        k *= v
    out_elems = batch * c_out
    for v in out_spatial:
        out_elems *= v
    in_elems = batch * c_in
    for v in in_spatial:
        in_elems *= v
    weights = c_out * (c_in // groups) * k
    return LayerFeature(
        name, "conv", out_elems * (c_in // groups) * k, in_elems * dtype_bytes, out_elems * dtype_bytes,
        weights * dtype_bytes, (c_out if bias else 0) * dtype_bytes,
    )


def linear_feature(name: str, *, n_in: int, n_out: int, batch: int = 1, bias: bool = True,
                   dtype_bytes: int = 4) -> LayerFeature:
    return LayerFeature(
        name, "linear", batch * n_in * n_out, batch * n_in * dtype_bytes, batch * n_out * dtype_bytes,
        n_in * n_out * dtype_bytes, (n_out if bias else 0) * dtype_bytes,
    )


# What a refusal says hmt can price, and the way out for a layer it cannot.
PRICED_LAYERS = ("hmt prices convolutions, linear layers, pooling, BatchNorm, GroupNorm, LayerNorm, InstanceNorm, "
                 "PReLU, dropout and layers without parameters; write the layer with those (a per-channel scale "
                 "is a depthwise 1x1 convolution)")


def _numel(t: Any) -> int:
    return int(t.numel()) if hasattr(t, "numel") else 0


def layer_features(module: torch.nn.Module, input_shape: Sequence[int], *, batch: int = 1) -> list[LayerFeature]:
    """Run ``module`` once on zeros of ``(batch, *input_shape)`` and return its layers' features."""
    import torch
    from torch import nn

    free = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
            nn.AlphaDropout, nn.Identity, nn.Flatten)
    pools = (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d,
             nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)
    # Per-element work with parameters: none folds into a convolution at export.
    elementwise = (nn.PReLU, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d)
    records: list[LayerFeature] = []
    unknown: list[str] = []
    handles = []

    def hook(name: str):  # type: ignore[no-untyped-def]
        def record(mod: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            x = inputs[0] if inputs else None
            bytes_per = int(x.element_size()) if x is not None and hasattr(x, "element_size") else 4
            in_b = _numel(x) * bytes_per
            out_b = _numel(output) * bytes_per
            if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                k = 1
                for v in mod.kernel_size:
                    k *= v
                macs = _numel(output) * (mod.in_channels // mod.groups) * k
                w = _numel(mod.weight) * bytes_per
                b = _numel(mod.bias) * bytes_per if mod.bias is not None else 0
                records.append(LayerFeature(name, "conv", macs, in_b, out_b, w, b))
            elif isinstance(mod, nn.Linear):
                macs = _numel(output) * mod.in_features
                b = _numel(mod.bias) * bytes_per if mod.bias is not None else 0
                records.append(LayerFeature(name, "linear", macs, in_b, out_b, _numel(mod.weight) * bytes_per, b))
            elif isinstance(mod, free):
                return
            elif isinstance(mod, pools):
                records.append(LayerFeature(name, "pool", _numel(x), in_b, out_b, 0, 0))
            elif isinstance(mod, elementwise):
                params_b = sum(_numel(p) for p in mod.parameters(recurse=False)) * bytes_per
                records.append(LayerFeature(name, "elementwise", _numel(output), in_b, out_b, params_b, 0))
            elif not any(True for _ in mod.parameters(recurse=False)):
                records.append(LayerFeature(name, "elementwise", _numel(output), in_b, out_b, 0, 0))
            else:
                unknown.append(f"{name} ({type(mod).__name__})")

        return record

    for name, sub in module.named_modules():
        if next(iter(sub.children()), None) is None:
            handles.append(sub.register_forward_hook(hook(name or type(sub).__name__)))
    try:
        with torch.inference_mode():
            # On the module's own device: costs are also taken of supernets loaded on a GPU.
            device = next(module.parameters(), torch.empty(0)).device
            module(torch.zeros((batch, *input_shape), device=device))
    finally:
        for handle in handles:
            handle.remove()
    if unknown:
        raise ModelError(f"no cost model for layers with parameters: {', '.join(unknown)}; {PRICED_LAYERS}")
    return records


def block_totals(features: Sequence[LayerFeature]) -> dict[str, float]:
    """Sums over a block's layers (C, M) and the MAC-weighted mean intensity."""
    macs = sum(f.macs for f in features)
    moved = sum(f.bytes_moved for f in features)
    return {"macs": float(macs), "bytes_moved": float(moved), "intensity": macs / moved if moved else 0.0,
            "n_layers": float(len(features))}
