"""Small user-written models for the elastify tests: SE, hardswish/SiLU, depthwise convs,
max-pooling inside blocks, concatenation branches, a 1-D backbone, a sequence run as a
one-channel image (a spectrogram CNN), and an untraceable one."""

from __future__ import annotations

import torch
from torch import nn


class SE(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, max(4, channels // 4), 1)
        self.fc2 = nn.Conv2d(max(4, channels // 4), channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(torch.relu(self.fc1(self.pool(x)))))


class InvertedSE(nn.Module):
    """Expand 1x1 -> depthwise 3x3 (hardswish) -> SE -> project 1x1, residual when it can."""

    def __init__(self, cin: int, cout: int, stride: int, act: type[nn.Module] = nn.Hardswish) -> None:
        super().__init__()
        hidden = cin * 3
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), act())
        self.dw = nn.Sequential(
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden), act()
        )
        self.se = SE(hidden)
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.project(self.se(self.dw(self.expand(x))))
        return x + out if self.residual else out


class PoolBlock(nn.Module):
    """conv-BN-SiLU, max-pooling inside the block, conv-BN-SiLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.SiLU())
        self.pool = nn.MaxPool2d(2)
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.pool(self.a(x)))


class Branches(nn.Module):
    """Inception-like: two branches concatenated."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        half = cout // 2
        self.left = nn.Sequential(nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())
        self.right = nn.Sequential(
            nn.Conv2d(cin, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(),
            nn.Conv2d(half, half, 3, padding=1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.left(x), self.right(x)], dim=1)


class UserNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.b1 = InvertedSE(16, 16, 1)
        self.b2 = InvertedSE(16, 24, 2, act=nn.SiLU)
        self.b3 = InvertedSE(24, 24, 1)
        self.b4 = PoolBlock(24, 32)
        self.b5 = Branches(32, 32)
        self.b6 = Branches(32, 32)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b6(self.b5(self.b4(self.b3(self.b2(self.b1(self.stem(x)))))))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def user_net() -> nn.Module:
    return UserNet()


class Block1d(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv1d(c, c, 5, padding=2, bias=False), nn.BatchNorm1d(c), nn.ReLU())
        self.b = nn.Sequential(nn.Conv1d(c, c, 5, padding=2, bias=False), nn.BatchNorm1d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b(self.a(x)))


class Net1d(nn.Module):
    def __init__(self, channels: int = 6, num_classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(channels, 16, 7, padding=3, bias=False), nn.BatchNorm1d(16), nn.ReLU())
        self.b1 = Block1d(16)
        self.down = nn.Sequential(nn.Conv1d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm1d(32), nn.ReLU())
        self.b2 = Block1d(32)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.b2(self.down(self.b1(self.stem(x)))).mean(dim=2))


def net_1d() -> nn.Module:
    return Net1d()


class Gate(nn.Module):
    """Data-dependent control flow: cannot be traced symbolically."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.mean() > 0:
            return torch.relu(self.conv(x))
        return x


class Untraceable(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.b1 = InvertedSE(16, 16, 1)
        self.gate = Gate(16)
        self.b2 = InvertedSE(16, 16, 1)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b2(self.gate(self.b1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def untraceable() -> nn.Module:
    return Untraceable()


def trained_user_net() -> nn.Module:
    """A factory that returns the network with weights of its own (as one loading its
    checkpoint would): seeded weights and non-trivial BN statistics."""
    with torch.random.fork_rng():
        torch.manual_seed(11)
        net = UserNet()
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return net.eval()


class AuxOutputNet(nn.Module):
    """Returns (logits, auxiliary logits) in training mode, as GoogLeNet and Inception do."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(8, 10)
        self.aux = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x).mean((2, 3))
        return (self.fc(h), self.aux(h)) if self.training else self.fc(h)


def aux_output_net() -> nn.Module:
    return AuxOutputNet()


class BasicBlock(nn.Module):
    """A CIFAR ResNet basic block: identity shortcut, or 1x1 conv + BN where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class TinyResNet(nn.Module):
    """A CIFAR ResNet-18 in miniature: 3x3 stem, two basic blocks per stage, widths 8-16-32."""

    def __init__(self, num_classes: int = 10, widths: tuple[int, ...] = (8, 16, 32)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def tiny_resnet() -> nn.Module:
    """A tiny ResNet with weights of its own (seeded; non-trivial BN statistics)."""
    with torch.random.fork_rng():
        torch.manual_seed(5)
        net = TinyResNet()
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.data.uniform_(0.2, 1.5)
    return net.eval()


class SequenceAsImage(nn.Module):
    """A spectrogram CNN: a (batch, mels, frames) sequence unsqueezed to one channel, then 2-D convs."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.b1 = BasicBlock(8, 8, 1)
        self.b2 = BasicBlock(8, 16, 2)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b2(self.b1(self.stem(x.unsqueeze(1))))
        return self.fc(x.mean(dim=(2, 3)))


def sequence_as_image() -> nn.Module:
    return SequenceAsImage()


def tied_resnet() -> nn.Module:
    """The tiny ResNet with two blocks' second convolutions sharing one weight (weight tying)."""
    net = tiny_resnet()
    blocks = net.layers
    blocks[1].conv2.weight = blocks[0].conv2.weight  # type: ignore[union-attr,index]
    return net


def batch_statistics_net() -> nn.Module:
    """Norms without running statistics (track_running_stats=False: batch statistics in eval
    too), with and without an affine scale, in the stem, a width group and the stream."""
    def norm(c: int, affine: bool = True) -> nn.Module:
        return nn.BatchNorm2d(c, affine=affine, track_running_stats=False)

    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), norm(8), nn.ReLU(),
        Residual(nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), norm(16), nn.ReLU(),
                               nn.Conv2d(16, 8, 3, padding=1, bias=False), norm(8, affine=False))),
        nn.Conv2d(8, 16, 3, 2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


class Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class ChannelsLastBlock(nn.Module):
    """A transformer block's MLP half on (N, H, W, C) features, as Swin's stages run."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.fc1 = nn.Linear(channels, 2 * channels)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class PatchMerging(nn.Module):
    """Swin's downsampling: 2x2 neighbours concatenated on the channel axis, then a Linear to 2C."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * channels)
        self.reduce = nn.Linear(4 * channels, 2 * channels, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.reduce(self.norm(torch.cat(parts, -1)))


class SwinLike(nn.Module):
    """Channels-last stages ((N, H, W, C) between them): 16 channels at 8x8, then 32 at 4x4."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 16, 4, 4)
        self.stage1 = nn.Sequential(ChannelsLastBlock(16), ChannelsLastBlock(16))
        self.merge = PatchMerging(16)
        self.stage2 = nn.Sequential(ChannelsLastBlock(32), ChannelsLastBlock(32))
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.merge(self.stage1(self.embed(x).permute(0, 2, 3, 1))))
        return self.head(self.norm(x).mean(dim=(1, 2)))


def swin_like() -> nn.Module:
    return SwinLike()


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise conv, then LayerNorm and the MLP channels-last, permuted back."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.mlp = ChannelsLastBlock(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.dw(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def convnext_like() -> nn.Module:
    """(N, C, H, W) between stages, though every block runs channels-last inside."""
    return nn.Sequential(nn.Conv2d(3, 16, 4, 4), ConvNeXtBlock(16), ConvNeXtBlock(16),
                         nn.Conv2d(16, 32, 2, 2), ConvNeXtBlock(32), ConvNeXtBlock(32),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
