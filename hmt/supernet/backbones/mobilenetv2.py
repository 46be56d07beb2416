"""MobileNetV2 for 32x32 inputs (stride-1 stem and first stages, as is usual on CIFAR).

Exits sit after each change of resolution: stages are the groups at 32, 16, 8 and 4 px.
"""

from __future__ import annotations

from torch import nn

from hmt.supernet.backbones.registry import BackboneDef, assign_choices, register_backbone
from hmt.supernet.exits import ClassifierHead
from hmt.supernet.operators import bn, conv

# (expand ratio t, out channels c, repeats n, first stride s, stage index)
_SETTINGS = (
    (1, 16, 1, 1, 0),
    (6, 24, 2, 1, 0),
    (6, 32, 3, 2, 1),
    (6, 64, 4, 2, 2),
    (6, 96, 3, 1, 2),
    (6, 160, 3, 2, 3),
    (6, 320, 1, 1, 3),
)


def _divisible(channels: float, divisor: int = 8) -> int:
    """Round to a multiple of 8, never below 90% of the request (torchvision's rule)."""
    out = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * channels else out


@register_backbone("mobilenetv2")
def build_mobilenetv2(*, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]) -> BackboneDef:
    return _build("mobilenetv2", 1.0, num_classes=num_classes, input_shape=input_shape, operators=operators)


@register_backbone("mobilenetv2_050")
def build_mobilenetv2_050(*, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]) -> BackboneDef:
    """MobileNetV2 at width 0.5 (every channel; the last conv keeps 1280, as in the paper)."""
    return _build("mobilenetv2_050", 0.5, num_classes=num_classes, input_shape=input_shape, operators=operators)


def _build(
    name: str, width: float, *, num_classes: int, input_shape: tuple[int, ...], operators: tuple[str, ...]
) -> BackboneDef:
    raw: list[list[dict]] = [[], [], [], []]
    first = _divisible(32 * width)
    in_ch = first
    for t, c_full, n, s, stage in _SETTINGS:
        c = _divisible(c_full * width)
        for i in range(n):
            stride = s if i == 0 else 1
            identity = stride == 1 and in_ch == c
            raw[stage].append(
                {
                    "kind": "inverted",
                    "in": in_ch,
                    "out": c,
                    "mid": in_ch * t,
                    "stride": stride,
                    "shortcut": "identity" if identity else "none",
                }
            )
            in_ch = c
    channels = input_shape[0]

    last = in_ch

    def stem() -> nn.Module:
        return nn.Sequential(conv(2, channels, first, 3), bn(2, first), nn.ReLU6(inplace=True))

    def head() -> nn.Module:
        pre = nn.Sequential(conv(2, last, 1280, 1), bn(2, 1280), nn.ReLU6(inplace=True))
        return ClassifierHead(2, last, num_classes, pre=pre, pre_channels=1280, dropout=0.2)

    return BackboneDef(
        name=name,
        dims=2,
        input_shape=input_shape,
        num_classes=num_classes,
        stem=stem,
        stem_channels=first,
        stages=assign_choices(raw, operators, dims=2),
        head=head,
    )
