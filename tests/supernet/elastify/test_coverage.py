"""Every model of the coverage list traces, gets a space, its largest variant equals the
original to 1e-5 and every materialised variant equals the supernet path for it.

Parametrised over a registry (as timm's tests are): torchvision architectures at CIFAR
size with random weights, and user-written models (SE, hardswish/SiLU, depthwise, max-pool
inside blocks, concatenation branches, a 1-D backbone, a sequence run as a one-channel image).
The torchvision cases offer a few operators to keep the default suite fast; the user models
offer all of them.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from hmt.convert.export import export_module
from hmt.supernet.elastify.supernet import ElastifiedSupernet, largest_error
from hmt.supernet.space import SearchSpace

HERE = Path(__file__).resolve().parent
FAST_OPERATORS = ("w50", "k1", "skip", "merge")


def user_models() -> object:
    spec = importlib.util.spec_from_file_location("elastify_test_models", HERE / "models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchvision(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if importlib.util.find_spec("torchvision") is None:
            pytest.skip("torchvision is not installed (pip install 'hmt[offline]')")
        from hmt.supernet.elastify.source import import_torchvision

        return getattr(import_torchvision().models, name)(num_classes=10)

    return build


SLOW = {"resnet50", "vgg11_bn", "regnet_y_400mf", "efficientnet_b0"}
# id -> (factory, input shape without batch, operators offered: None = all)
REGISTRY: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], tuple[str, ...] | None]] = {
    **{
        name: (_torchvision(name), (3, 32, 32), FAST_OPERATORS)
        for name in (
            "resnet18",
            "resnet50",
            "mobilenet_v2",
            "mobilenet_v3_small",
            "efficientnet_b0",
            "shufflenet_v2_x1_0",
            "regnet_y_400mf",
            "vgg11_bn",
        )
    },
    "user_se_hardswish_silu_dw_maxpool_concat": (lambda: user_models().user_net(), (3, 32, 32), None),  # type: ignore[attr-defined]
    "user_1d": (lambda: user_models().net_1d(), (6, 64), None),  # type: ignore[attr-defined]
    # A sequence dataset's sample as a one-channel image: the exits follow the features (2-D), not the input.
    "user_sequence_as_image": (lambda: user_models().sequence_as_image(), (8, 16), None),  # type: ignore[attr-defined]
    # BatchNorm without running statistics: importance and slicing read none (exit 70 with sw50).
    "user_batch_statistics": (lambda: user_models().batch_statistics_net(), (3, 16, 16),  # type: ignore[attr-defined]
                              ("w50", "sw50", "lr50", "k1", "skip")),
    # Channels-last stages (Swin-style) and channels-last inside channels-first blocks (ConvNeXt-style).
    "user_swin_like": (lambda: user_models().swin_like(), (3, 32, 32), ("lr50", "skip")),  # type: ignore[attr-defined]
    "user_convnext_like": (lambda: user_models().convnext_like(), (3, 32, 32), FAST_OPERATORS),  # type: ignore[attr-defined]
}
CASES = [pytest.param(key, marks=pytest.mark.slow) if key in SLOW else key for key in REGISTRY]


@pytest.mark.parametrize("key", CASES)
def test_model_elastifies_exactly(key: str) -> None:
    factory, shape, operators = REGISTRY[key]
    torch.manual_seed(0)
    model = factory().eval()
    net = ElastifiedSupernet(copy.deepcopy(model), name=key, input_shape=shape, operators=operators, seed=0)
    space = net.space
    assert space.positions and space.num_stages >= 1
    assert SearchSpace.from_json_dict(space.to_json_dict()).tag == space.tag
    assert any(len(p.choices) > 1 for p in space.positions), "no block got an alternative"
    assert largest_error(net, model, seed=0) <= 1e-5
    # Materialised variants equal the supernet path (random ones, and the smallest).
    rng = np.random.default_rng(0)
    x = torch.randn(2, *shape)
    net.eval()
    for arch in (space.smallest(), space.sample(rng), space.sample(rng)):
        variant = net.materialize(arch)
        with torch.no_grad():
            assert torch.allclose(variant(x), net(x, arch), atol=1e-5, rtol=0)
        stem = net.variant_blocks(arch)[0]
        assert stem[0] == "stem" and (stem[1] == "base" or net.stream is not None)  # a slim stream slims the stem


@pytest.mark.parametrize(("key", "last"), [("user_swin_like", True), ("user_convnext_like", False),
                                           ("user_se_hardswish_silu_dw_maxpool_concat", False)])
def test_early_exits_read_channels_where_the_stage_keeps_them(key: str, last: bool) -> None:
    """A stage handing on (N, H, W, C) got an exit head built for H channels, run over the W and C
    axes as if they were space: nothing failed, the exits were built on the wrong axis."""
    factory, shape, operators = REGISTRY[key]
    torch.manual_seed(0)
    net = ElastifiedSupernet(factory().eval(), name=key, input_shape=shape, operators=operators, seed=0).eval()
    heads = list(net.exits)[:-1]
    assert heads, "the model has one stage: no early exit to check"
    x = torch.randn(2, *shape)
    for stage, head in enumerate(heads):
        features = net.forward_stage_features(x, net.space.largest())[stage]
        channels = features.shape[-1] if last else features.shape[1]
        assert head.channels_last is last and head.features[0].in_channels == channels
        assert net.run_exit(stage, features).shape == (2, 10)
        # Through convert's exporter to ONNX Runtime (movedim(-1, 1) exported an invalid Transpose).
        proto, _ = export_module(head, [features[:1]], input_names=["x"], what="exit head")
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        with torch.no_grad():
            expected = head(features[:1]).numpy()
        assert np.abs(session.run(None, {"x": features[:1].numpy()})[0] - expected).max() < 1e-4


def test_every_operator_appears_somewhere() -> None:
    torch.manual_seed(0)
    net = ElastifiedSupernet(user_models().user_net(), name="u", input_shape=(3, 32, 32))  # type: ignore[attr-defined]
    offered = {c for p in net.space.positions for c in p.choices}
    assert offered == {"base", "w75", "w50", "w25", "lr50", "lr25", "dws", "k1", "skip", "merge"}
    kinds = {p.kind for p in net.space.positions}
    assert {"inverted-se", "concat"} <= kinds


def test_width_keeps_the_most_important_channels() -> None:
    torch.manual_seed(0)
    models = user_models()
    net = ElastifiedSupernet(models.net_1d(), name="n", input_shape=(6, 64))  # type: ignore[attr-defined]
    block = net.blocks[0]  # Block1d(16): a (conv -> BN -> ReLU) group feeding conv b
    half = block.alts["w50"]
    assert half.get_submodule("b1.a.0").out_channels == 8
    assert half.get_submodule("b1.b.0").in_channels == 8
    assert half.get_submodule("b1.b.0").out_channels == 16  # the block output keeps its width
    # Low rank at full SVD init reproduces the conv closely at 50%: its output is finite and shaped.
    x = torch.randn(2, 16, 64)
    assert block.alts["lr50"].eval()(x).shape == block.base(x).shape


def test_untraceable_model_is_refused_in_one_line_and_works_with_leaf() -> None:
    from hmt.errors import ModelError

    models = user_models()
    with pytest.raises(ModelError) as caught:
        ElastifiedSupernet(models.untraceable(), name="u", input_shape=(3, 32, 32))  # type: ignore[attr-defined]
    message = str(caught.value)
    assert "\n" not in message
    assert "module 'gate' (Gate)" in message and "models.py:" in message and "--leaf gate" in message
    torch.manual_seed(0)
    model = models.untraceable().eval()  # type: ignore[attr-defined]
    net = ElastifiedSupernet(copy.deepcopy(model), name="u", input_shape=(3, 32, 32), leaves=("gate",))
    assert largest_error(net, model, seed=0) <= 1e-5
    opaque = [r for r in net.reports if r.kind == "opaque"]
    assert len(opaque) == 1 and opaque[0].choices == ["base"] and "gate" in opaque[0].notes["all"]


class _InPlaceTrick(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.relu_()
        z = y * 2  # reads y after the in-place change
        return self.fc(torch.relu(z).mean(dim=(2, 3)))


def test_in_place_trick_is_refused_naming_the_way_out() -> None:
    from hmt.errors import ModelError

    with pytest.raises(ModelError, match=r"in-place relu_ .*--leaf"):
        ElastifiedSupernet(_InPlaceTrick(), name="t", input_shape=(3, 8, 8))


def test_unknown_leaf_is_a_usage_error() -> None:
    from hmt.errors import ModelError

    with pytest.raises(ModelError, match="no submodule"):
        ElastifiedSupernet(user_models().user_net(), name="u", input_shape=(3, 32, 32), leaves=("nope",))  # type: ignore[attr-defined]


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.round(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


class _Quantise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _StraightThrough.apply(x)


class _WithCustomFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.quant = _Quantise()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv2(self.quant(self.conv(x))).mean(dim=(2, 3)))


def test_custom_autograd_function_is_refused_and_kept_whole_with_leaf() -> None:
    from hmt.errors import ModelError

    with pytest.raises(ModelError, match=r"module 'quant' \(_Quantise\) .*custom autograd Function .*--leaf quant"):
        ElastifiedSupernet(_WithCustomFunction(), name="q", input_shape=(3, 8, 8))
    model = _WithCustomFunction().eval()
    net = ElastifiedSupernet(copy.deepcopy(model), name="q", input_shape=(3, 8, 8), leaves=("quant",))
    assert largest_error(net, model, seed=0) <= 1e-5


def test_block_choices_enumerate_for_the_latency_table() -> None:
    """profile-device and pareto price every (position, choice) as a plain module."""
    torch.manual_seed(0)
    net = ElastifiedSupernet(user_models().net_1d(), name="n", input_shape=(6, 64))  # type: ignore[attr-defined]
    refs = list(net.iter_block_choices())
    expected = 1 + sum(len(p.choices) for p in net.space.positions) + net.space.num_stages
    assert len(refs) == expected
    for ref in refs:
        with torch.no_grad():
            ref.module(torch.zeros(1, *ref.input_shape))


class _WithOptions(nn.Module):
    """forward(x, mask=None, *, temperature=1.0, return_features=False), as research code has."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, temperature: float = 1.0,
                return_features: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if mask is not None:
            x = x * mask
        features = self.block(self.stem(x)).mean((2, 3))
        logits = self.fc(features) / temperature
        return (logits, features) if return_features else logits


def test_forward_options_with_defaults_are_traced_at_their_defaults() -> None:
    """hmt calls the model with the input alone; an option branching on a Python flag was
    refused as 'a traced tensor in Python control flow ... pass its path to --leaf'."""
    torch.manual_seed(0)
    model = _WithOptions().eval()
    net = ElastifiedSupernet(copy.deepcopy(model), name="o", input_shape=(3, 8, 8))
    assert largest_error(net, model, seed=0) <= 1e-5
    assert any(len(p.choices) > 1 for p in net.space.positions)
