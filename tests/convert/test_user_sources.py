"""A user's model file and weights: a weights file that does not fit the model is refused in
one line that says what differs (missing and unexpected names, shapes), with a hint for
DataParallel's 'module.' prefix; a whole model pickled with torch.save(model) is refused naming
its class, without torch's advice to load it unsafely; a model file importing a module beside it
says why that fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hmt.convert.sources import apply_weights, load_factory_module, load_state_dict, weights_mismatch
from hmt.errors import InputError, ModelError


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(8, 10))


def _state() -> dict[str, torch.Tensor]:
    return {k: v.clone().contiguous() for k, v in _net().state_dict().items()}


def test_weights_that_fit_load_exactly(tmp_path: Path) -> None:
    state = _state()
    assert weights_mismatch(_net().state_dict(), state) is None
    save_file(state, str(tmp_path / "w.safetensors"))
    net = _net()
    apply_weights(net, tmp_path / "w.safetensors")
    assert all(torch.equal(net.state_dict()[k], v) for k, v in state.items())


@pytest.mark.parametrize(("change", "needles"), [
    ("missing", ["1 missing (3.bias)"]),
    ("shape", ["shapes differ: 3.weight is [100, 8] in the file, [10, 8] in the model"]),
    ("prefix", ["missing (0.weight, 0.bias, 1.weight and", "9 unexpected (module.", "'module.'", "DataParallel"]),
    ("compiled", ["9 unexpected (_orig_mod.", "'_orig_mod.'", "torch.compile"]),
])
def test_weights_that_do_not_fit_are_refused_in_one_line(tmp_path: Path, change: str, needles: list[str]) -> None:
    state = _state()
    if change == "missing":
        del state["3.bias"]
    elif change == "shape":
        state["3.weight"] = torch.zeros(100, 8)
    elif change == "prefix":
        state = {f"module.{k}": v for k, v in state.items()}
    else:
        state = {f"_orig_mod.{k}": v for k, v in state.items()}
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    with pytest.raises(InputError) as caught:
        apply_weights(_net(), path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: weights do not fit the model: ")
    for needle in needles:
        assert needle in message
    assert ("strip it" in message) == (change in ("prefix", "compiled"))


def test_weights_holding_nan_or_inf_are_refused_naming_the_tensors(tmp_path: Path) -> None:
    # A diverged run's weights once trained a whole supernet on NaN and failed writing it (exit 70).
    state = _state()
    state["3.weight"][0, 0] = float("nan")
    state["1.running_var"][2] = float("inf")
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    net = _net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(InputError) as caught:
        apply_weights(net, path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: 2 tensor(s) hold NaN or infinite values")
    assert "1.running_var" in message and "3.weight" in message
    assert all(torch.equal(net.state_dict()[k], v) for k, v in before.items())  # nothing loaded


def test_a_model_file_importing_a_module_beside_it_says_why_that_fails(tmp_path: Path) -> None:
    (tmp_path / "helpers.py").write_text("import torch\ndef head():\n    return torch.nn.Linear(3, 10)\n")
    (tmp_path / "net.py").write_text("from helpers import head\ndef build():\n    return head()\n")
    with pytest.raises(ModelError) as caught:
        load_factory_module(f"{tmp_path / 'net.py'}:build")
    message = str(caught.value)
    assert "\n" not in message and "No module named 'helpers'" in message
    assert "keeps only that one file" in message


class PickledNet(torch.nn.Linear):
    """A user's class: torch.save(model) pickles a reference to it."""


def test_a_whole_pickled_model_is_refused_naming_its_class(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(PickledNet(3, 2), path)
    with pytest.raises(InputError) as caught:
        load_state_dict(path)
    message = str(caught.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith(f"{path}: refused: it holds a pickled ") and "PickledNet" in message
    assert "torch.save(model)" in message and "state_dict()" in message
    assert "weights_only` set to `False`" not in message  # torch's advice to run the file's code is not passed on


@pytest.mark.parametrize(("cast", "name"), [("double", "float64"), ("half", "float16")])
def test_a_model_not_in_float32_is_refused_saying_so(tmp_path: Path, cast: str, name: str) -> None:
    """It failed later as 'forward failed ... (wrong --input-shape?): Input type (float) and bias
    type (double) should be the same'."""
    (tmp_path / "net.py").write_text(f"import torch\ndef build():\n    return torch.nn.Conv2d(3, 8, 3).{cast}()\n")
    with pytest.raises(ModelError) as caught:
        load_factory_module(f"{tmp_path / 'net.py'}:build")
    message = str(caught.value)
    assert f"returned a model with {name} weights; hmt takes float32 models" in message
    assert "return model.float()" in message


class _Versioned(torch.nn.Module):
    """Reads the state dict's version metadata, as torchvision's MNASNet does (it raised
    ValueError 'version should be set to 1 or 2 instead of None' for a safetensors file, which
    holds no metadata, and train-supernet --torchvision mnasnet0_5 ended in exit 70)."""

    _version = 2

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict, *args: object) -> None:  # type: ignore[override]
        if local_metadata.get("version") not in (1, 2):
            raise ValueError(f"version should be set to 1 or 2 instead of {local_metadata.get('version')}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_weights_load_into_a_module_that_reads_its_version(tmp_path: Path, suffix: str) -> None:
    source = _Versioned()
    path = tmp_path / f"w{suffix}"
    state = {k: v.clone() for k, v in source.state_dict().items()}
    save_file(state, str(path)) if suffix == ".safetensors" else torch.save(source.state_dict(), path)
    net = _Versioned()
    apply_weights(net, path)
    assert torch.equal(net.fc.weight, source.fc.weight)


class _Refusing(torch.nn.Linear):
    def _load_from_state_dict(self, *args: object) -> None:  # type: ignore[override]
        raise ValueError("this layer refuses the file")


def test_a_module_refusing_its_weights_is_an_input_error_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({k: v.clone() for k, v in torch.nn.Linear(3, 2).state_dict().items()}, str(path))
    with pytest.raises(InputError) as caught:
        apply_weights(_Refusing(3, 2), path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: weights do not fit the model: ")
    assert "ValueError: this layer refuses the file" in message


def test_a_model_file_importing_torchvision_loads(tmp_path: Path) -> None:
    """PyPI's torchvision wheels link CUDA torch; with CPU torch, ``import torchvision`` dies
    registering torchvision::nms. --torchvision worked around it, yet a model file doing its own
    import (at the top or inside the factory) failed: 'importing the model file failed:
    RuntimeError: operator torchvision::nms does not exist'. A fresh interpreter, so no earlier
    test has imported torchvision already."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    (tmp_path / "top.py").write_text("from torchvision.models import squeezenet1_1\n"
                                     "def build():\n    return squeezenet1_1(num_classes=10)\n")
    (tmp_path / "inside.py").write_text("def build():\n    import torchvision\n"
                                        "    return torchvision.models.squeezenet1_1(num_classes=10)\n")
    code = ("import sys; from hmt.convert.sources import load_factory_module\n"
            "for name in sys.argv[1:]:\n    print(type(load_factory_module(name + ':build')).__name__)\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "top.py"), str(tmp_path / "inside.py")],
                          capture_output=True, text=True, cwd=repo, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SqueezeNet", "SqueezeNet"]


class _TiedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_weights_of_a_tied_model_saved_once_load(tmp_path: Path) -> None:
    """safetensors' save_model (save_file refuses shared tensors) keeps one name of a tied pair;
    the file was refused as '1 missing (b.weight)'."""
    from safetensors.torch import save_model

    source = _TiedNet()
    path = tmp_path / "tied.safetensors"
    save_model(source, str(path))
    assert len(load_state_dict(path)) == len(source.state_dict()) - 1
    net = _TiedNet()
    apply_weights(net, path)
    assert torch.equal(net.a.weight, source.a.weight) and torch.equal(net.b.weight, source.a.weight)
    assert net.b.weight is net.a.weight  # still tied
    assert torch.equal(net.b.bias, source.b.bias)
    state = {k: v.clone() for k, v in source.state_dict().items() if k != "b.bias"}
    save_file(state, str(path))
    with pytest.raises(InputError, match=r"1 missing \(b\.bias\)"):  # an untied missing tensor is still refused
        apply_weights(_TiedNet(), path)
