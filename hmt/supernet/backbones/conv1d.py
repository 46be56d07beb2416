"""A 1-D residual convolutional backbone for sensor windows (BasicMotions: 6 x 100) and
audio features (Free Spoken Digits log-mel: 40 x T)."""

from __future__ import annotations

from torch import nn

from hmt.errors import UsageError
from hmt.supernet.backbones.registry import BackboneDef, assign_choices, register_backbone
from hmt.supernet.exits import ClassifierHead
from hmt.supernet.operators import conv_bn

_WIDTHS = (32, 64, 128)


@register_backbone("conv1d")
def build_conv1d(*, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]) -> BackboneDef:
    if len(input_shape) != 2:
        raise UsageError(f"backbone conv1d takes sequence inputs (channels, length), got shape {input_shape}")
    raw: list[list[dict]] = []
    in_ch = _WIDTHS[0]
    for s, width in enumerate(_WIDTHS):
        stage = []
        for i in range(2):
            stride = 2 if (s > 0 and i == 0) else 1
            stage.append({"kind": "basic", "in": in_ch, "out": width, "mid": width, "stride": stride})
            in_ch = width
        raw.append(stage)
    channels = input_shape[0]
    return BackboneDef(
        name="conv1d",
        dims=1,
        input_shape=input_shape,
        num_classes=num_classes,
        stem=lambda: nn.Sequential(*conv_bn(1, channels, _WIDTHS[0], 5), nn.ReLU(inplace=True)),
        stem_channels=_WIDTHS[0],
        stages=assign_choices(raw, operators, dims=1, kernel=3),
        head=lambda: ClassifierHead(1, _WIDTHS[-1], num_classes),
    )
