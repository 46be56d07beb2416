"""A user's model of a kind elastification does not take is refused in one line that says
what it got, what is supported and how to get there."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from hmt.errors import ModelError, UsageError
from hmt.supernet.elastify.source import ModelSpec
from hmt.supernet.elastify.supernet import ElastifiedSupernet
from hmt.supernet.elastify.train import _check_output, _check_priced, space_notes


class _DictOutput(nn.Module):
    """Returns a dict, as Hugging Face style models do."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.conv(x).mean(dim=(2, 3))
        return {"logits": self.fc(features), "features": features}


def test_dict_output_is_refused_naming_its_keys_and_the_way_out() -> None:
    spec = ModelSpec(input_shape=(1, 3, 8, 8), file="net.py", factory="build")
    with pytest.raises(UsageError) as caught:
        _check_output(_DictOutput(), spec, 10)
    message = str(caught.value)
    assert "\n" not in message
    assert "returns a dict (keys 'logits', 'features')" in message
    assert "--input-shape 1,3,8,8" in message  # as typed, not a Python tuple
    assert "(1, 10) logits" in message and "wrap it" in message


def test_wrong_logit_count_names_the_shape() -> None:
    spec = ModelSpec(input_shape=(1, 3, 8, 8), file="net.py", factory="build")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    with pytest.raises(UsageError, match=r"returns \(1, 4\) for --input-shape 1,3,8,8; expected \(1, 10\) logits"):
        _check_output(model, spec, 10)


def test_mlp_is_refused_saying_what_is_supported() -> None:
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    with pytest.raises(ModelError) as caught:
        ElastifiedSupernet(mlp, name="mlp", input_shape=(1, 8, 8))
    message = str(caught.value)
    assert "\n" not in message and "as an MLP does" in message
    assert "convolutional classifiers" in message and "(batch, C, H, W)" in message


class _LayerScale(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((1, channels, 1, 1), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


def test_a_layer_no_stage_can_price_is_refused_before_training() -> None:
    """pareto and profile-device price every variant layer by layer; elastify says so before
    training, not after, naming the layer and what is priced."""
    spec = ModelSpec(input_shape=(1, 3, 8, 8), file="net.py", factory="build")
    priced = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.PReLU(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                           nn.Linear(8, 10))
    _check_priced(priced, spec)
    scaled = nn.Sequential(nn.Conv2d(3, 8, 3), _LayerScale(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    with pytest.raises(ModelError) as caught:
        _check_priced(scaled, spec)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("cannot elastify: no cost model for layers with parameters: 1 ")
    assert "(_LayerScale)" in message and "depthwise 1x1 convolution" in message


def test_operators_no_block_takes_are_said_before_training() -> None:
    """A plain VGG-style net whose head flattens a 7x7 map: no block can take inner or stream
    widths. The user who asked for them hears so, and why, before any training."""
    torch.manual_seed(0)
    vgg = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                        nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 10)).eval()
    net = ElastifiedSupernet(vgg, name="vgg", input_shape=(1, 14, 14), operators=("w50", "sw50"))
    notes = space_notes(net, ("w50", "sw50"))
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert notes[0].startswith("note: no block got an alternative") and "w50: not offered" in notes[0]
    assert "early exits alone" in notes[0]
    assert notes[1].startswith("note: sw50 not offered: no stream widths: the head: ")
    assert "other than channel by channel" in notes[1]
    assert space_notes(ElastifiedSupernet(vgg, name="vgg", input_shape=(1, 14, 14)), None) == []


def test_a_model_ending_in_softmax_is_refused() -> None:
    """Probabilities taken for logits train badly (cross-entropy of a softmax) and give serve's
    early exits flat confidences; a log_softmax is fine (softmax of it is the model's)."""
    spec = ModelSpec(input_shape=(1, 3, 8, 8), file="net.py", factory="build")
    body = [nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)]
    with pytest.raises(UsageError, match=r"outputs are probabilities .*ends in a softmax.*before the softmax"):
        _check_output(nn.Sequential(*body, nn.Softmax(dim=1)), spec, 10)
    _check_output(nn.Sequential(*body, nn.LogSoftmax(dim=1)), spec, 10)
    _check_output(nn.Sequential(*body), spec, 10)


def _convnet() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def _old_weight_norm() -> nn.Module:
    net = _convnet()
    with pytest.warns(FutureWarning):
        torch.nn.utils.weight_norm(net[2])
    return net


def _scripted() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated
        return torch.jit.script(_convnet())


def _lazy() -> nn.Module:
    return nn.Sequential(nn.LazyConv2d(8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


@pytest.mark.parametrize(("make", "needles"), [
    # Each ended in exit 70 (copy.deepcopy of the model) or in a refusal pointing at --leaf.
    (_old_weight_norm, ["'2' uses torch.nn.utils.weight_norm", "parametrizations.weight_norm", "remove_weight_norm"]),
    (_lazy, ["uninitialized lazy parameters (0.weight, 0.bias)", "once on an example input"]),
    (_scripted, ["TorchScript module", "return the nn.Module"]),
], ids=["old-weight-norm", "lazy", "torchscript"])
def test_a_model_hmt_cannot_copy_or_trace_is_refused_saying_what_to_change(make: object, needles: list[str]) -> None:
    from hmt.supernet.elastify.trace import copy_of

    model = make()  # type: ignore[operator]
    for attempt in (lambda: copy_of(model), lambda: ElastifiedSupernet(model, name="m", input_shape=(3, 8, 8))):
        with pytest.raises(ModelError) as caught:
            attempt()
        message = str(caught.value)
        assert "\n" not in message and message.startswith("cannot elastify")
        assert "--leaf" not in message
        for needle in needles:
            assert needle in message


def test_a_model_that_cannot_be_deep_copied_is_refused_in_one_line() -> None:
    from hmt.supernet.elastify.trace import copy_of

    class _NoCopy(nn.Sequential):
        def __deepcopy__(self, memo: dict) -> nn.Module:
            raise RuntimeError("holds a handle\nthat cannot be copied")

    with pytest.raises(ModelError, match=r"^cannot elastify: the model cannot be copied \(copy\.deepcopy raised "
                                         r"RuntimeError: holds a handle\)"):
        copy_of(_NoCopy(*_convnet()))
