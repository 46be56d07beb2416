"""CIFAR ResNets (He et al. 2016): 3 stages of 16/32/64 channels, option-A shortcuts.

Weights of ResNet-20/32/44/56 trained on the original CIFAR-10 pixels load from the
akamaster files in ``shared/models/resnet-cifar10`` (``module.``-prefixed state dicts).
"""

from __future__ import annotations

import re

from torch import nn

from hmt.supernet.backbones.registry import BackboneDef, assign_choices, register_backbone
from hmt.supernet.exits import ClassifierHead
from hmt.supernet.operators import conv_bn

_DEPTHS = {"cifar_resnet8": 1, "cifar_resnet20": 3, "cifar_resnet32": 5, "cifar_resnet44": 7, "cifar_resnet56": 9}
_WIDTHS = (16, 32, 64)


def _build(name: str, *, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]) -> BackboneDef:
    n = _DEPTHS[name]
    raw: list[list[dict]] = []
    in_ch = _WIDTHS[0]
    for s, width in enumerate(_WIDTHS):
        stage = []
        for i in range(n):
            stride = 2 if (s > 0 and i == 0) else 1
            stage.append(
                {
                    "kind": "basic",
                    "in": in_ch,
                    "out": width,
                    "mid": width,
                    "stride": stride,
                    "shortcut": "identity" if (stride == 1 and in_ch == width) else "option_a",
                }
            )
            in_ch = width
        raw.append(stage)
    channels = input_shape[0]

    def stem() -> nn.Module:
        return nn.Sequential(*conv_bn(2, channels, _WIDTHS[0], 3), nn.ReLU(inplace=True))

    return BackboneDef(
        name=name,
        dims=2,
        input_shape=input_shape,
        num_classes=num_classes,
        stem=stem,
        stem_channels=_WIDTHS[0],
        stages=assign_choices(raw, operators, dims=2),
        head=lambda: ClassifierHead(2, _WIDTHS[-1], num_classes),
        pretrained_mapping=lambda sd: map_akamaster_state_dict(sd, n),
    )


def map_akamaster_state_dict(state: dict, blocks_per_stage: int) -> dict:
    """Rename akamaster keys to this supernet's: base path, base BN, stem, final head."""
    mapped = {}
    pattern = re.compile(r"^(?:module\.)?layer(\d)\.(\d+)\.(conv|bn)(\d)\.(.+)$")
    for key, value in state.items():
        plain = key.removeprefix("module.")
        match = pattern.match(plain)
        if match:
            stage, idx, layer, which, rest = match.groups()
            pos = (int(stage) - 1) * blocks_per_stage + int(idx)
            if layer == "conv":
                mapped[f"blocks.{pos}.conv{which}.{rest}"] = value
            else:
                mapped[f"blocks.{pos}.bn{which}.base.{rest}"] = value
        elif plain.startswith("conv1."):
            mapped["stem.0." + plain.removeprefix("conv1.")] = value
        elif plain.startswith("bn1."):
            mapped["stem.1." + plain.removeprefix("bn1.")] = value
        elif plain.startswith("linear."):
            mapped["head_linear." + plain.removeprefix("linear.")] = value
        else:
            mapped[plain] = value  # unknown keys surface as a clear mismatch error
    return mapped


for _name in _DEPTHS:
    register_backbone(_name)(lambda _n=_name, **kw: _build(_n, **kw))
