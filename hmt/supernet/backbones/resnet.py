"""ResNet-18/34 with the CIFAR stem (3x3 conv, no max-pool) and projection shortcuts."""

from __future__ import annotations

from torch import nn

from hmt.supernet.backbones.registry import BackboneDef, assign_choices, register_backbone
from hmt.supernet.exits import ClassifierHead
from hmt.supernet.operators import conv_bn

_LAYOUTS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3)}
_WIDTHS = (64, 128, 256, 512)


def _build(name: str, *, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]) -> BackboneDef:
    raw: list[list[dict]] = []
    in_ch = _WIDTHS[0]
    for s, (count, width) in enumerate(zip(_LAYOUTS[name], _WIDTHS, strict=True)):
        stage = []
        for i in range(count):
            stride = 2 if (s > 0 and i == 0) else 1
            stage.append({"kind": "basic", "in": in_ch, "out": width, "mid": width, "stride": stride})
            in_ch = width
        raw.append(stage)
    channels = input_shape[0]
    return BackboneDef(
        name=name,
        dims=2,
        input_shape=input_shape,
        num_classes=num_classes,
        stem=lambda: nn.Sequential(*conv_bn(2, channels, _WIDTHS[0], 3), nn.ReLU(inplace=True)),
        stem_channels=_WIDTHS[0],
        stages=assign_choices(raw, operators, dims=2),
        head=lambda: ClassifierHead(2, _WIDTHS[-1], num_classes),
    )


for _name in _LAYOUTS:
    register_backbone(_name)(lambda _n=_name, **kw: _build(_n, **kw))
