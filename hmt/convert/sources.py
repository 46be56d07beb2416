"""Where a model to convert comes from: a torch factory, an ONNX file, or a supernet variant.

Weights files are never unpickled freely: ``.safetensors`` through safetensors, anything
else through ``torch.load(weights_only=True)``, which refuses pickles that build
arbitrary objects (a malicious ``.pt`` is refused before its payload runs).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hmt.errors import InputError, ModelError, UsageError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TorchSource:
    """``path/to/file.py:factory`` returning an ``nn.Module``; optional weights; input shapes with batch."""

    factory: str
    input_shapes: tuple[tuple[int, ...], ...]
    weights: Path | None = None
    name: str = "model"


@dataclass(frozen=True)
class OnnxSource:
    path: Path
    name: str = "model"


@dataclass(frozen=True)
class SupernetSource:
    artifact_dir: Path
    variant_ids: tuple[str, ...] = field(default_factory=tuple)
    batch: int = 1
    # Every point of this pareto artifact's front (searched on the same supernet) joins variant_ids.
    pareto_dir: Path | None = None
    max_variants: int | None = None
    min_accuracy: float | None = None  # a fraction: front points below it are not converted


ModelSource = TorchSource | OnnxSource | SupernetSource


def source_inputs(source: ModelSource) -> list[Path | str]:
    """The files and folders a conversion of ``source`` reads (never replaced by its output)."""
    if isinstance(source, TorchSource):
        found: list[Path | str | None] = [source.factory.rpartition(":")[0] or None, source.weights]
    elif isinstance(source, OnnxSource):
        found = [source.path]
    else:
        found = [source.artifact_dir, source.pareto_dir]
    return [p for p in found if p]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,32,32"`` -> ``(1, 3, 32, 32)``; UsageError on anything else."""
    parts = [p.strip() for p in re.split(r"[,x]", text.strip())]
    if not parts or not all(p.isdigit() for p in parts):
        raise UsageError(f"input shape {text!r}: expected comma-separated positive integers like 1,3,32,32")
    shape = tuple(int(p) for p in parts)
    if any(d <= 0 for d in shape):
        raise UsageError(f"input shape {text!r}: expected comma-separated positive integers like 1,3,32,32")
    return shape


def safe_variant_name(name: str) -> str:
    """A folder name for a variant id: letters, digits, ``._-`` only."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "variant"
    return cleaned[:120]


def load_factory_module(spec: str) -> torch.nn.Module:
    """Import ``file.py`` and call ``factory()``; ModelError naming the file and cause on failure."""
    import torch

    if ":" not in spec:
        raise UsageError(f"--model {spec!r}: expected path/to/file.py:factory_function")
    file_text, _, func_name = spec.rpartition(":")
    path = Path(file_text)
    if not path.is_file() or path.suffix != ".py":
        raise InputError(f"--model {spec!r}: {path} is not a Python file")
    if not func_name.isidentifier():
        raise UsageError(f"--model {spec!r}: {func_name!r} is not a function name")
    module_name = f"hmt_user_model_{uuid.uuid4().hex[:12]}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise InputError(f"{path}: cannot be imported as a Python module")
    module, loader = importlib.util.module_from_spec(module_spec), module_spec.loader
    sys.modules[module_name] = module
    try:
        _with_torchvision(lambda: loader.exec_module(module))
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ModelError(f"{path}: importing the model file failed: {type(exc).__name__}: {exc}"
                         f"{_not_installed_hint(exc)}") from exc
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise InputError(f"{path}: defines no function {func_name!r}")
    try:
        net = _with_torchvision(factory)
    except Exception as exc:
        raise ModelError(f"{path}:{func_name}() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(net, torch.nn.Module):
        raise ModelError(f"{path}:{func_name}() returned {type(net).__name__}, expected a torch.nn.Module")
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in (*net.parameters(), *net.buffers())
                     if t.is_floating_point() and t.dtype != torch.float32})
    if dtypes:
        raise ModelError(f"{path}:{func_name}() returned a model with {', '.join(dtypes)} weights; hmt takes float32 "
                         "models (precisions are hmt's to choose: pareto --precision): return model.float()")
    return net.eval()


def import_torchvision() -> Any:
    """``import torchvision``, also where its compiled ops do not match this torch.

    PyPI's torchvision wheels link CUDA torch; with CPU torch their ``_C`` library fails to
    load and ``torchvision._meta_registrations`` then dies registering ``torchvision::nms`` and
    ``qnms``. The models need none of those ops, so declare the two schemas and import again.
    """
    import torch

    try:
        import torchvision

        return torchvision
    except ModuleNotFoundError as exc:
        raise UsageError("--torchvision needs the torchvision package: pip install 'hmt[offline]'") from exc
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise ModelError(f"importing torchvision failed: {exc}") from exc
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    library = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(library)
    import torchvision

    return torchvision


_KEEP: list[Any] = []  # the Library object must outlive the import


def _with_torchvision(call: Callable[[], Any]) -> Any:
    """``call()`` (the user's file or factory); where it dies importing torchvision on its
    ops' mismatch with this torch (see :func:`import_torchvision`), again after that import."""
    try:
        return call()
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
    import_torchvision()
    return call()


def _not_installed_hint(exc: Exception) -> str:
    """Why a module beside the model file is not found: the file is imported alone."""
    if not isinstance(exc, ModuleNotFoundError):
        return ""
    return ("; hmt imports the model file by itself (its folder is not on the import path) and a supernet "
            "artifact keeps only that one file: put the model's code in it, or in an installed package")


def _why_not_weights(exc: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a line: the class it would have
    had to run (a whole model saved with torch.save(model)), else the error's first line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # torch puts terminal bold into the message
    pickled = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if pickled:
        return (f"it holds a pickled {pickled.group(1)} (a whole model saved with torch.save(model)?), code that "
                "torch.load(weights_only=True) does not run")
    unpickler = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)  # the cause, after torch's advice
    lines = [unpickler.group(1)] if unpickler else text.strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    return (f"not a plain tensor state dict that torch.load(weights_only=True) accepts "
            f"({type(exc).__name__}: {first[:300]})")


def load_state_dict(path: Path) -> dict[str, Any]:
    """A flat state dict from safetensors or a ``weights_only`` torch file (nested "state_dict" accepted)."""
    import torch

    if not path.is_file():
        raise InputError(f"{path}: does not exist; expected a weights file")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(path), device="cpu"))
        except Exception as exc:
            raise InputError(f"{path}: not a readable safetensors file ({exc})") from exc
    try:
        data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise InputError(f"{path}: refused: {_why_not_weights(exc)}; save the weights alone: "
                         "torch.save(model.state_dict(), FILE) or safetensors") from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
            break
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise InputError(f"{path}: expected a dict of tensor names to tensors (a state dict)")
    return _with_metadata(dict(data), getattr(data, "_metadata", None))


def _with_metadata(state: dict[str, Any], metadata: Any) -> dict[str, Any]:
    """``state`` as an OrderedDict carrying torch's per-module ``_metadata`` (the layers'
    versions, which ``load_state_dict`` passes to each module), as ``Module.state_dict()`` gives it."""
    ordered: Any = OrderedDict(state)
    if metadata is not None:
        ordered._metadata = metadata
    return ordered


def apply_weights(net: torch.nn.Module, path: Path) -> None:
    """Load ``path`` into ``net`` (strict); InputError saying in one line what does not fit.

    A file without torch's per-module versions (safetensors holds none) loads at the versions of
    ``net``'s own layers: the names and shapes match it exactly, so it was saved from this code.
    """
    state = _with_tied(net.state_dict(), load_state_dict(path))
    mismatch = weights_mismatch(net.state_dict(), state)
    if mismatch:
        raise InputError(f"{path}: weights do not fit the model: {mismatch}")
    broken = [k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if broken:
        raise InputError(f"{path}: {len(broken)} tensor(s) hold NaN or infinite values ({_listed(broken)}); "
                         "expected the weights of a trained model: save them again from a run that did not diverge")
    if getattr(state, "_metadata", None) is None:
        state = _with_metadata(state, getattr(net.state_dict(), "_metadata", None))
    try:
        net.load_state_dict(state, strict=True)
    except Exception as exc:  # a layer's own _load_from_state_dict may raise anything
        text = " ".join(str(exc).split())
        kind = "" if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: "
        raise InputError(f"{path}: weights do not fit the model: {kind}{text[:300]}") from exc


def _with_tied(expected: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with each name it lacks that is the same tensor in the model as a name it has
    (tied weights, stored once as safetensors' save_model stores them) filled from that name."""
    def same(tensor: Any) -> tuple[Any, ...]:
        return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride())

    holder: dict[tuple[Any, ...], str] = {}
    for name, tensor in expected.items():
        if name in given and tensor.numel():
            holder.setdefault(same(tensor), name)
    filled = {name: given[holder[same(tensor)]] for name, tensor in expected.items()
              if name not in given and tensor.numel() and same(tensor) in holder}
    return _with_metadata({**given, **filled}, getattr(given, "_metadata", None)) if filled else given


def _listed(items: list[str], shown: int = 3) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def weights_mismatch(expected: dict[str, Any], given: dict[str, Any]) -> str | None:
    """What keeps the state dict ``given`` from loading where ``expected`` is the model's, in
    one line (missing and unexpected names, shapes that differ), or None when it fits."""
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    shapes = [f"{k} is {list(given[k].shape)} in the file, {list(expected[k].shape)} in the model"
              for k in expected if k in given and tuple(given[k].shape) != tuple(expected[k].shape)]
    parts = [f"{len(missing)} missing ({_listed(missing)})"] if missing else []
    parts += [f"{len(unexpected)} unexpected ({_listed(unexpected)})"] if unexpected else []
    parts += [f"shapes differ: {_listed(shapes, 2)}"] if shapes else []
    if not parts:
        return None
    text = "; ".join(parts)
    for prefix, saver in (("module.", "DataParallel"), ("_orig_mod.", "a torch.compile'd model")):
        stripped = {k[len(prefix):] for k in given if k.startswith(prefix)}
        if unexpected and len(stripped) == len(given) and stripped == set(expected):
            text += f" (every name in the file starts with {prefix!r}, as {saver} saves them: strip it)"
    return text


def example_inputs(shapes: tuple[tuple[int, ...], ...], *, seed: int) -> list[torch.Tensor]:
    """Seeded standard-normal inputs of the given shapes (a torch.Generator, never global state)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def run_reference(net: torch.nn.Module, inputs: list[torch.Tensor], *, what: str) -> list[Any]:
    """Outputs of ``net`` as numpy arrays; ModelError (naming the shapes) when the forward fails."""
    import torch

    try:
        with torch.no_grad():
            out = net(*inputs)
    except Exception as exc:
        shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
        raise ModelError(
            f"{what}: forward failed on input shape {shapes} (wrong --input-shape?): {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc
    return [t.detach().cpu().numpy() for t in flatten_outputs(out, what=what)]


def flatten_outputs(out: Any, *, what: str) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        items: list[Any] = []
        for item in out:
            items.extend(flatten_outputs(item, what=what))
        return items
    if isinstance(out, dict):
        return flatten_outputs(list(out.values()), what=what)
    raise ModelError(f"{what}: forward returned {type(out).__name__}; expected tensors")
