"""VGG-16 with batch norm, for 32x32 inputs: five stages, each entered through a max-pool
(except the first), and a single linear classifier on the 1x1 map."""

from __future__ import annotations

from torch import nn

from hmt.supernet.backbones.registry import BackboneDef, assign_choices, register_backbone
from hmt.supernet.exits import ClassifierHead
from hmt.supernet.operators import bn, conv

_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


@register_backbone("vgg16_bn")
def build_vgg16_bn(*, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]) -> BackboneDef:
    # The stem is the first conv; the remaining convs are elastic plain blocks.
    raw: list[list[dict]] = []
    in_ch = _STAGES[0][0]
    for s, widths in enumerate(_STAGES):
        stage = []
        for i, width in enumerate(widths):
            if s == 0 and i == 0:
                continue
            stage.append({"kind": "plain", "in": in_ch, "out": width, "mid": width, "stride": 1})
            in_ch = width
        raw.append(stage)
    stages = assign_choices(raw, operators, dims=2)
    for stage_def in stages[1:]:
        stage_def.entry = lambda: nn.MaxPool2d(2)
    channels = input_shape[0]

    def head() -> nn.Module:
        return ClassifierHead(2, 512, num_classes, pre=nn.MaxPool2d(2), pre_channels=512)

    return BackboneDef(
        name="vgg16_bn",
        dims=2,
        input_shape=input_shape,
        num_classes=num_classes,
        stem=lambda: nn.Sequential(conv(2, channels, 64, 3), bn(2, 64), nn.ReLU(inplace=True)),
        stem_channels=64,
        stages=stages,
        head=head,
    )
