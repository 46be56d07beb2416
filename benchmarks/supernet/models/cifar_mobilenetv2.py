"""torchvision's MobileNetV2 with a CIFAR stem, as users adapt it to 32x32 images: the
first convolution and the first strided inverted-residual stage run at stride 1, so the
last feature map is 4x4 instead of 1x1 (the usual CIFAR port of the architecture)."""

from __future__ import annotations

from torch import nn


def build(num_classes: int = 10) -> nn.Module:
    from hmt.supernet.elastify.source import import_torchvision

    tv = import_torchvision()
    net = tv.models.mobilenet_v2(weights=None, num_classes=num_classes)
    net.features[0][0].stride = (1, 1)  # stem conv 3x3: stride 2 -> 1
    net.features[2].conv[1][0].stride = (1, 1)  # first stride-2 block (24 channels): -> 1
    return net
