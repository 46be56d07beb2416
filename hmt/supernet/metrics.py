"""Cost metrics of a materialised model: parameters, MACs, activation memory and bytes of
memory access (AdaScale eq. 4: M = sum over layers of (in + out + weights + bias) x bytes).

Counted with forward hooks on leaf modules over one batch-1 input; profile-device uses the
per-layer records as the features of its latency and energy fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

BYTES_PER_FLOAT32 = 4


@dataclass(frozen=True)
class LayerStat:
    name: str
    op_type: str
    macs: int
    params: int
    input_elements: int
    output_elements: int

    @property
    def memory_access_bytes(self) -> int:
        return (self.input_elements + self.output_elements + self.params) * BYTES_PER_FLOAT32

    def to_json_dict(self) -> dict[str, object]:
        return asdict(self) | {"memory_access_bytes": self.memory_access_bytes}


@dataclass(frozen=True)
class ModelCost:
    params: int
    macs: int
    activation_peak_bytes: int
    memory_access_bytes: int
    layers: tuple[LayerStat, ...]

    def summary(self) -> dict[str, int]:
        return {
            "params": self.params,
            "macs": self.macs,
            "activation_peak_bytes": self.activation_peak_bytes,
            "memory_access_bytes": self.memory_access_bytes,
        }


def _layer_macs(module: nn.Module, inp: torch.Tensor, out: torch.Tensor) -> int:
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        kernel = 1
        for k in module.kernel_size:
            kernel *= k
        return out.numel() * (module.in_channels // module.groups) * kernel
    if isinstance(module, nn.Linear):
        return out.numel() * module.in_features
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return inp.numel()  # scale + shift, counted once (folded into the conv at export)
    return 0


def measure_cost(model: nn.Module, input_shape: tuple[int, ...]) -> ModelCost:
    """Cost of ``model`` at batch 1. Activation peak: the largest (input + output) of any layer
    plus what residual connections keep alive is approximated by the largest pair, the
    quantity a sequential runtime must hold at once."""
    records: list[LayerStat] = []
    hooks = []

    def hook(name: str):  # type: ignore[no-untyped-def]
        def fn(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            inp = inputs[0] if inputs else torch.empty(0)
            records.append(
                LayerStat(
                    name=name,
                    op_type=type(module).__name__,
                    macs=_layer_macs(module, inp, output),
                    params=sum(p.numel() for p in module.parameters(recurse=False)),
                    input_elements=inp.numel(),
                    output_elements=output.numel() if isinstance(output, torch.Tensor) else 0,
                )
            )

        return fn

    for name, module in model.named_modules():
        if len(list(module.children())) == 0:
            hooks.append(module.register_forward_hook(hook(name)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = next(model.parameters(), torch.empty(0)).device
            model(torch.zeros(1, *input_shape, device=device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    # Only executed layers count: a variant also carries the heads of its earlier exits,
    # which its final-exit path never runs.
    params = sum(r.params for r in records)
    peak = max(((r.input_elements + r.output_elements) for r in records), default=0) * BYTES_PER_FLOAT32
    return ModelCost(
        params=params,
        macs=sum(r.macs for r in records),
        activation_peak_bytes=peak,
        memory_access_bytes=sum(r.memory_access_bytes for r in records),
        layers=tuple(records),
    )
